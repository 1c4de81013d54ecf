"""Cached leases follow their sandbox through every listing: one deleted while the watch was
away (a reconnect, a store outage) is in no later listing, and its leases leave the cache when
the ingress lists again."""

from __future__ import annotations

import anyio
import pytest

from tests.support.ingress import stack
from tests.support.waiting import eventually
from wakeful.domain import keys
from wakeful.domain.models import App, Sandbox, SandboxStatus
from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.routing import RoutingTable, match
from wakeful.ingress.sandboxes import _Leaving
from wakeful.store import Item, open_store
from wakeful.testing import FakeLeases, FakeSandbox

pytestmark = pytest.mark.anyio


def running(sandbox_id: str) -> Item[Sandbox]:
    record = Sandbox(
        id=sandbox_id, pool="hello-v1", app="hello", node="n1",
        status=SandboxStatus.RUNNING, ready=True, address="127.0.0.1:9",
    )  # fmt: skip
    return Item(f"sandboxes/{sandbox_id}", record, 1)


async def test_a_relisting_drops_the_leases_of_sandboxes_no_longer_listed() -> None:
    leases = FakeLeases(
        {"hello": [FakeSandbox("sb-1", "http://a", 1), FakeSandbox("sb-2", "http://b", 1)]}
    )
    cache = LeaseCache(leases, idle_ttl=60)
    for _ in range(2):
        use = await cache.acquire(("hello", None))
        cache.put(use)  # idle in the cache now
    assert sorted(e.grant.sandbox_id for e in cache.snapshot()) == ["sb-1", "sb-2"]
    async with anyio.create_task_group() as tasks:
        _Leaving(cache, tasks).replace([running("sb-1")], revision=7)  # sb-2 was deleted
    assert [e.grant.sandbox_id for e in cache.snapshot()] == ["sb-1"]
    assert leases.leased == {"sb-1": 1, "sb-2": 0}  # handed back to the lease service


async def test_the_routing_table_says_when_an_app_written_to_the_store_is_routed() -> None:
    """`wakeful up` writes its control file only once the apps it deployed are routed: a
    script that waits for the file never meets a 404 for them."""
    async with open_store("memory://") as store, anyio.create_task_group() as tasks:
        table = RoutingTable(store)
        tasks.start_soon(table.run)
        routed = anyio.Event()

        async def wait() -> None:
            await table.wait_for("hello")
            routed.set()

        tasks.start_soon(wait)
        await table.synced.wait()
        await anyio.sleep(0.05)
        assert not routed.is_set()  # no such app yet
        await store.put(keys.app("hello"), App(name="hello", active_version="v1"))
        with anyio.fail_after(10):
            await routed.wait()
        assert match(table.index, "hello.localhost", "localhost") == "hello"
        tasks.cancel_scope.cancel()


async def test_an_ingress_tells_the_activator_how_far_its_routes_have_come() -> None:
    """What a deploy waits on (`GET /v1/apps/{app}/routed`): the ingress reports its routes'
    revision as it moves, and stops being waited for as it stops."""
    async with stack({}) as s:
        seen = s.routes_seen
        with anyio.fail_after(10):
            await eventually(
                lambda: len(seen) == 1 and seen.behind(s.ingress.routes.revision) == {}
            )
        written = await s.store.put(keys.app("shop"), App(name="shop", active_version="v1"))
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(written) == {})
        assert match(s.ingress.routes.index, "shop.localhost", "localhost") == "shop"
    assert len(seen) == 0  # stopped: a deploy waits for it no more
