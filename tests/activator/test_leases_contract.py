"""One contract for every implementation of `wakeful.domain.leases.Leases`: the activator
in-process, over HTTP and over the lease channel, and the package's `FakeLeases`. A test of
something that holds leases can use the fake because it answers as the real thing does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from tests.support.control import running_control_plane
from tests.support.waiting import eventually
from wakeful.activator.client import ChannelLeases, HttpLeases, InProcessLeases
from wakeful.aio.marks import Marks
from wakeful.domain import keys
from wakeful.domain.leases import LeaseGone, Leases, UnknownApp
from wakeful.domain.models import (
    App,
    AppSpec,
    Concurrency,
    Node,
    Pool,
    Sandbox,
    SandboxStatus,
)
from wakeful.testing import FakeLeases, FakeSandbox

pytestmark = pytest.mark.anyio
URL = "http://127.0.0.1:9"
ROUTES_SEEN = pytest.StashKey[Marks | None]()
"""Where the activator behind a test's `leases` keeps the ingresses' routes (None: nowhere)."""


@pytest.fixture(params=["in-process", "http", "channel", "fake"])
async def leases(request: pytest.FixtureRequest, tmp_path: object) -> AsyncIterator[Leases]:
    if request.param == "fake":
        fake = FakeLeases({"hello": [FakeSandbox("sb-1", URL, capacity=1)]})
        request.node.stash[ROUTES_SEEN] = fake.routes_seen
        yield fake
        return
    async with running_control_plane(tmp_path) as control:  # type: ignore[arg-type]
        store = control.store
        # A live node holds the sandbox, or the pool controller would release it.
        node_lease = await store.grant(60)
        await store.put(keys.node("n1"), Node(name="n1", address="127.0.0.1"), lease=node_lease)
        await store.put(keys.app("hello"), App(name="hello", active_version="v1"))
        pool = Pool(
            name="hello-v1", app="hello", version="v1", desired_instances=1,
            # max 1: the full sandbox is all there is, so the next request overflows on it.
            spec=AppSpec(
                command=["serve"],
                concurrency=Concurrency(requests_per_instance=1, max_instances=1),
            ),
        )  # fmt: skip
        await store.put(keys.pool("hello-v1"), pool)
        sandbox = Sandbox(
            id="sb-1", pool="hello-v1", app="hello", node="n1", owner="n1", epoch=1,
            status=SandboxStatus.RUNNING, ready=True, address="127.0.0.1:9",
        )  # fmt: skip
        await store.put(keys.sandbox("sb-1"), sandbox)
        seen = control.plane.routes_seen
        request.node.stash[ROUTES_SEEN] = None if request.param == "http" else seen
        if request.param == "in-process":
            yield InProcessLeases(control.plane.activator, seen)
        elif request.param == "channel":
            async with ChannelLeases(control.url, control.token) as channel:
                yield channel
        else:
            async with HttpLeases(control.url, control.token) as http:
                yield http


async def test_an_unknown_app_is_refused(leases: Leases) -> None:
    with pytest.raises(UnknownApp):
        await leases.acquire("nosuchapp")


async def test_a_grant_names_a_sandbox_of_the_app_and_renews_as_itself(leases: Leases) -> None:
    with anyio.fail_after(30):
        grant = await leases.acquire("hello")
    assert (grant.sandbox_id, grant.url) == ("sb-1", URL)
    assert grant.size >= 1 and grant.ttl_seconds > 0 and not grant.overflow
    renewed = await leases.renew(grant.lease_id, used=True)
    assert (renewed.lease_id, renewed.sandbox_id) == (grant.lease_id, grant.sandbox_id)
    # The sandbox is at its target (one request): the next request is admitted over it, on
    # an overflow lease of size 1 (invariant 2), not refused and not kept waiting.
    with anyio.fail_after(30):
        other = await leases.acquire("hello")
    assert other.lease_id != grant.lease_id
    assert (other.sandbox_id, other.size, other.overflow) == ("sb-1", 1, True)
    # ...so the pool is short: a renewal asks the holder for the leases it is not using.
    assert not renewed.spare_wanted
    assert (await leases.renew(grant.lease_id)).spare_wanted
    await leases.release(other.lease_id)
    await leases.release(grant.lease_id)


async def test_a_released_lease_is_gone_and_releasing_it_again_is_harmless(
    leases: Leases,
) -> None:
    with anyio.fail_after(30):
        grant = await leases.acquire("hello")
    await leases.release(grant.lease_id)
    with pytest.raises(LeaseGone):
        await leases.renew(grant.lease_id)
    await leases.release(grant.lease_id)
    with pytest.raises(LeaseGone):
        await leases.renew("never-granted")


async def test_a_pool_turning_short_is_told_where_it_can_be(leases: Leases) -> None:
    """Between renewals, a holder hears that a pool turned short as it does (an overflow
    grant), once, by app and the version its grants say: in-process, on the lease channel
    and from the fake. Plain HTTP cannot be told; its renewals say it."""
    heard: list[tuple[str, str]] = []

    def broken(app: str, version: str) -> None:
        raise RuntimeError("a listener's own bug")

    leases.heed_short(broken)  # logged: neither the grant nor the others' news is lost
    leases.heed_short(lambda app, version: heard.append((app, version)))
    stopped: list[str] = []
    leases.heed_short(lambda app, version: stopped.append(app))()  # stopped at once
    with anyio.fail_after(30):
        grant = await leases.acquire("hello")
        other = await leases.acquire("hello")  # over the full sandbox: the pool turns short
        third = await leases.acquire("hello")  # short already: nothing new to tell
    assert other.overflow and third.overflow
    expected = [] if isinstance(leases, HttpLeases) else [("hello", grant.version)]
    await eventually(lambda: heard == expected)
    await anyio.sleep(0.1)  # nothing more comes
    assert heard == expected
    assert stopped == []
    for each in (grant, other, third):
        await leases.release(each.lease_id)


async def test_the_routes_an_ingress_follows_are_known_where_they_can_be(
    leases: Leases, request: pytest.FixtureRequest
) -> None:
    """In-process, on the lease channel and in the fake, the activator learns how far an
    ingress's routes have come, and forgets it when the ingress says it stops; over plain
    HTTP nowhere (a deploy does not wait for such an ingress)."""
    seen = request.node.stash[ROUTES_SEEN]
    leases.routes("edge-1", 41)
    leases.routes("edge-1", 42)
    if seen is None:
        assert isinstance(leases, HttpLeases)
        return
    with anyio.fail_after(10):
        await eventually(lambda: seen.behind(43) == {"edge-1": 42})
    leases.routes("edge-1", None)  # it drains: forgotten at once, not after a linger
    with anyio.fail_after(10):
        await eventually(lambda: len(seen) == 0)
