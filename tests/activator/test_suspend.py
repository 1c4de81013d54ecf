"""The suspended tier in the activator (issue 18), on each store: idle sandboxes are frozen
after `suspend_delay` and never while they hold a lease; a request thaws them before anything
starts, and demand beyond them scales up in the same step; a node's memory cap stops the
longest suspended with its pool shrunk in one transaction."""

from __future__ import annotations

import math

import anyio
import pytest

from tests.support.activator import POOL_KEY, make_activator, pool, sandbox, seed
from tests.support.waiting import eventually
from wakeful.activator.core import Activator
from wakeful.activator.ledger import Lease
from wakeful.domain import keys
from wakeful.domain.leases import LeaseGrant
from wakeful.domain.models import (
    App,
    AppSpec,
    Concurrency,
    Frozen,
    Node,
    Pool,
    Sandbox,
    SandboxStatus,
)
from wakeful.domain.models import SandboxStatus as S
from wakeful.store import Store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio
T0 = 1_000.0
MiB = 1 << 20


async def seed_suspendable(
    store: Store,
    statuses: dict[str, SandboxStatus],
    *,
    rpi: int = 5,
    desired: int | None = None,
    min_instances: int = 0,
    delay: float = 30.0,
) -> None:
    """The pool of `seed`, with `suspend_delay`, and sandboxes made at T0 (a suspended one
    was ready, as a suspend leaves it)."""
    await seed(store, rpi=rpi, desired=desired if desired is not None else len(statuses))
    found = await pool(store)
    spec = found.value.spec.model_copy(
        update={
            "concurrency": Concurrency(
                requests_per_instance=rpi, suspend_delay=delay, min_instances=min_instances
            )
        }
    )
    AppSpec.model_validate(spec.model_dump())
    await store.put(POOL_KEY, found.value.model_copy(update={"spec": spec}))
    for index, (sandbox_id, status) in enumerate(statuses.items()):
        made = sandbox(sandbox_id, SandboxStatus.RUNNING, 9000 + index)
        update: dict[str, object] = {"created_at": T0, "status": status}
        if status is SandboxStatus.SUSPENDED:
            update["suspended_at"] = T0 + index  # sb-1 the longest suspended
        await store.put(keys.sandbox(sandbox_id), made.model_copy(update=update))


async def record(store: Store, sandbox_id: str) -> Sandbox:
    found = await store.get(keys.sandbox(sandbox_id), Sandbox)
    assert found is not None
    return found.value


async def test_an_idle_sandbox_is_suspended_after_its_delay_and_not_before(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING})
    wall = ManualClock(T0)
    activator = make_activator(store, wall_clock=wall)
    async with activator.running(suspend=False):
        assert await activator.suspend_idle() == []  # first seen routable now
        wall.advance(29.9)
        assert await activator.suspend_idle() == []
        wall.advance(0.2)
        assert await activator.suspend_idle() == ["sb-1"]
        frozen = await record(store, "sb-1")
        assert frozen.status is SandboxStatus.SUSPENDED
        assert frozen.suspended_at == wall.now
        assert frozen.ready and frozen.address  # routable again the moment it is thawed
        snapshot = activator.snapshot()[0]
        assert (snapshot.live, snapshot.ready, snapshot.suspended) == (1, 0, 1)


async def test_a_sandbox_holding_a_lease_is_never_suspended(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING})
    wall = ManualClock(T0)
    activator = make_activator(store, wall_clock=wall)
    async with activator.running(suspend=False):
        lease = await activator.acquire("hello")
        wall.advance(3600)  # idle by its record: nobody renewed with use
        assert await activator.suspend_idle() == []
        activator.release(lease.lease_id)  # the release is traffic, at the current time
        wall.advance(29)
        assert await activator.suspend_idle() == []
        wall.advance(2)
        assert await activator.suspend_idle() == ["sb-1"]


async def test_a_pool_with_suspend_delay_0_is_never_suspended(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING}, delay=0)
    wall = ManualClock(T0)
    activator = make_activator(store, wall_clock=wall)
    async with activator.running(suspend=False):
        wall.advance(86_400)
        assert await activator.suspend_idle() == []


async def test_a_request_thaws_a_suspended_sandbox_and_starts_nothing(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.SUSPENDED})
    before = await pool(store)
    activator = make_activator(store)
    async with activator.running(suspend=False):
        with anyio.fail_after(10):
            lease = await activator.acquire("hello")
    assert lease.sandbox_id == "sb-1"
    assert lease.woke_by == "thaw" and lease.woke_after > 0
    assert lease.grant().woke_by == "thaw"  # what the ingress's Server-Timing says
    thawed = await record(store, "sb-1")
    assert thawed.status is SandboxStatus.RUNNING and thawed.suspended_at == 0
    assert (await pool(store)).revision == before.revision  # no scale-up write at all


async def test_a_burst_thaws_every_suspended_sandbox_and_scales_up_beyond_in_one_step(
    store: Store,
) -> None:
    await seed_suspendable(
        store,
        {f"sb-{n}": SandboxStatus.SUSPENDED for n in (1, 2, 3)},
        rpi=5,
    )
    start = (await pool(store)).revision
    pool_writes = store.watch(keys.POOLS, start + 1)
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(suspend=False), anyio.create_task_group() as requests:
        for _ in range(35):
            requests.start_soon(acquire)
        with anyio.fail_after(10):
            write = await pool_writes.__anext__()
        grown = write.decode(Pool)  # type: ignore[union-attr]
        assert grown.desired_instances == 8  # ceil((0 + 35 + 1) / 5): 3 thawed + 5 new
        await eventually(lambda: len(leases) == 35)
        await eventually(lambda: activator.snapshot()[0].ready == 3)
    await pool_writes.aclose()  # type: ignore[attr-defined]
    # Which sandbox each took depends on when it arrived (after the first thaw, the rest may
    # be admitted over target there); all three are thawed for the demand either way.
    assert {lease.woke_by for lease in leases if lease.woke_after} == {"thaw"}
    for n in (1, 2, 3):
        assert (await record(store, f"sb-{n}")).status is SandboxStatus.RUNNING
    assert (await pool(store)).revision == write.revision  # one pool write


async def test_one_request_thaws_one_of_three_the_most_recently_suspended(store: Store) -> None:
    await seed_suspendable(store, {f"sb-{n}": SandboxStatus.SUSPENDED for n in (1, 2, 3)})
    activator = make_activator(store)
    async with activator.running(suspend=False):
        with anyio.fail_after(10):
            lease = await activator.acquire("hello")
    assert lease.sandbox_id == "sb-3"  # the warmest
    statuses = [(await record(store, f"sb-{n}")).status for n in (1, 2, 3)]
    assert statuses == [SandboxStatus.SUSPENDED, SandboxStatus.SUSPENDED, SandboxStatus.RUNNING]


async def test_a_request_arriving_while_a_suspend_is_written_waits_and_thaws_it(
    store: Store,
) -> None:
    """The suspend decision withholds the sandbox in the same step: a request in between
    gets no lease on it (it would be frozen under the request), it waits, and thaws it."""
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING})
    wall = ManualClock(T0)
    activator = make_activator(store, wall_clock=wall)
    suspender = activator._suspender
    leases: list[Lease] = []
    seen: list[tuple[SandboxStatus, int]] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(suspend=False), anyio.create_task_group() as tasks:
        assert suspender.idle(wall.now) == []
        wall.advance(31)
        chosen = suspender.idle(wall.now)
        assert [item.value.id for item in chosen] == ["sb-1"]
        tasks.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        assert leases == []  # withheld: not granted on a sandbox about to freeze
        assert await suspender.suspend(chosen[0], wall.now)
        await eventually(lambda: len(leases) == 1)
        seen.append(((await record(store, "sb-1")).status, activator.leased_on("sb-1")))
    assert leases[0].sandbox_id == "sb-1" and leases[0].woke_by == "thaw"
    assert seen == [(SandboxStatus.RUNNING, leases[0].size)]


async def test_a_lease_adopted_on_a_suspended_sandbox_thaws_it(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.SUSPENDED})
    activator = make_activator(store)
    grant = LeaseGrant(
        lease_id="held-1",
        sandbox_id="sb-1",
        url="http://127.0.0.1:9000",
        size=1,
        overflow=False,
        ttl_seconds=60,
    )
    async with activator.running(suspend=False):
        activator.adopt("hello", grant)
        await eventually(lambda: activator.snapshot()[0].ready == 1)
    assert (await record(store, "sb-1")).status is SandboxStatus.RUNNING


async def test_a_node_over_its_memory_cap_gets_its_longest_suspended_stopped_and_the_pool_shrunk(
    store: Store,
) -> None:
    await seed_suspendable(
        store, {"sb-1": SandboxStatus.SUSPENDED, "sb-2": SandboxStatus.SUSPENDED}, desired=2
    )
    await store.put(keys.node("n1"), asks(MiB, "sb-1", "sb-2"))
    activator = make_activator(store)
    async with activator.running(suspend=False):
        await eventually(lambda: evicting(activator) == ["sb-1", "sb-2"])
        await activator.suspend_idle()
    stopped = await record(store, "sb-1")
    assert stopped.status is SandboxStatus.STOPPING and "memory cap" in stopped.last_log
    assert (await record(store, "sb-2")).status is SandboxStatus.SUSPENDED
    shrunk = (await pool(store)).value
    assert shrunk.desired_instances == 1  # so the pool controller replaces nothing
    assert shrunk.last_scale is not None and shrunk.last_scale.by == "memory"


async def test_the_memory_cap_never_takes_a_pool_below_its_minimum(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.SUSPENDED}, desired=1, min_instances=1)
    await store.put(keys.node("n1"), asks(MiB, "sb-1"))
    activator = make_activator(store)
    async with activator.running(suspend=False):
        await eventually(lambda: evicting(activator) == ["sb-1"])
        await activator.suspend_idle()
    assert (await record(store, "sb-1")).status is SandboxStatus.SUSPENDED
    assert (await pool(store)).value.desired_instances == 1


async def test_a_lease_adopted_while_the_suspend_is_written_thaws_it_once_written(
    store: Store,
) -> None:
    """A takeover's late report lands between the decision and the write: the write lands,
    and the sandbox is thawed at once, so its requests are not held frozen."""
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING})
    wall = ManualClock(T0)
    activator = make_activator(store, wall_clock=wall)
    suspender = activator._suspender
    async with activator.running(suspend=False):
        suspender.idle(wall.now)
        wall.advance(31)
        [chosen] = suspender.idle(wall.now)
        activator.adopt("hello", grant("late-1"))
        assert await suspender.suspend(chosen, wall.now)
        await eventually(lambda: activator.snapshot()[0].ready == 1)
    assert (await record(store, "sb-1")).status is SandboxStatus.RUNNING
    assert activator.leased_on("sb-1") == 1


async def test_after_a_takeover_nothing_is_suspended_until_every_lease_can_have_been_reported(
    store: Store,
) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING})
    wall, clock = ManualClock(T0), ManualClock(0)
    activator = make_activator(store, clock=clock, wall_clock=wall, lease_ttl=60)
    async with activator.running(suspend=False, adopt_for=math.inf):
        wall.advance(3600)
        clock.advance(3600)
        assert await activator.suspend_idle() == []  # the adoption window: leases unknown
        activator.open_admission()
        assert await activator.suspend_idle() == []
        wall.advance(59)
        clock.advance(59)
        assert await activator.suspend_idle() == []  # idle for ages, but a late report may come
        wall.advance(2)
        clock.advance(2)
        assert await activator.suspend_idle() == []  # past a lease TTL: first seen now
        wall.advance(31)
        clock.advance(31)
        assert await activator.suspend_idle() == ["sb-1"]


async def test_a_pool_rolling_out_or_of_fixed_size_is_never_suspended(store: Store) -> None:
    await seed_suspendable(store, {"sb-1": SandboxStatus.RUNNING})
    wall = ManualClock(T0)
    activator = make_activator(store, wall_clock=wall)
    found = await pool(store)
    async with activator.running(suspend=False):
        await store.put(keys.app("hello"), App(name="hello", active_version="v0"))
        await eventually(lambda: activator.apps()[0].active_version == "v0")
        for _ in range(2):
            assert await activator.suspend_idle() == []  # v1 is not routed to yet
            wall.advance(3600)
        fixed = Concurrency(mode="fixed", min_instances=1, max_instances=1, suspend_delay=30)
        spec = found.value.spec.model_copy(update={"concurrency": fixed})
        await store.put(POOL_KEY, found.value.model_copy(update={"spec": spec}))
        await store.put(keys.app("hello"), App(name="hello", active_version="v1"))
        await eventually(lambda: activator.apps()[0].active_version == "v1")
        for _ in range(2):
            assert await activator.suspend_idle() == []  # fixed: exactly that many, running
            wall.advance(3600)


async def test_a_named_sandbox_holding_a_lease_is_not_stopped_and_each_list_is_acted_on_once(
    store: Store,
) -> None:
    """sb-1 comes first, but a lease was adopted on it (it is being thawed, so its memory is
    given up): it is not stopped, nor anything in its place. The same list read again is
    stale (sb-1 runs now) and stops nothing; the node's next list, without sb-1, does."""
    await seed_suspendable(
        store, {f"sb-{n}": SandboxStatus.SUSPENDED for n in (1, 2, 3)}, desired=3
    )
    await store.put(keys.node("n1"), asks(MiB, "sb-1", "sb-2", "sb-3"))
    activator = make_activator(store)
    async with activator.running(suspend=False):
        await eventually(lambda: evicting(activator) == ["sb-1", "sb-2", "sb-3"])
        activator.adopt("hello", grant("late-1"))  # its thaw is started, not run yet
        await activator.suspend_idle()
        await eventually(lambda: activator.snapshot()[0].ready == 1)
        await activator.suspend_idle()
        statuses = [(await record(store, f"sb-{n}")).status for n in (1, 2, 3)]
        assert statuses == [S.RUNNING, S.SUSPENDED, S.SUSPENDED]
        assert (await pool(store)).value.desired_instances == 3

        await store.put(keys.node("n1"), asks(MiB, "sb-2", "sb-3"))
        await eventually(lambda: evicting(activator) == ["sb-2", "sb-3"])
        await activator.suspend_idle()
    statuses = [(await record(store, f"sb-{n}")).status for n in (1, 2, 3)]
    assert statuses == [S.RUNNING, S.STOPPING, S.SUSPENDED]
    assert (await pool(store)).value.desired_instances == 2


def evicting(activator: Activator) -> list[str]:
    """The frozen sandboxes node n1 lists to give up memory from, as the activator's view has
    it."""
    record = activator._view.nodes.get("n1")
    return [] if record is None else [frozen.sandbox for frozen in record.value.evict]


def asks(wanted: int, *listed: str, each: int = MiB) -> Node:
    """Node n1's record asking to give up `wanted` bytes from `listed`, `each` holding."""
    frozen = [Frozen(sandbox=sandbox_id, memory=each) for sandbox_id in listed]
    return Node(name="n1", address="127.0.0.1", evict_bytes=wanted, evict=frozen)


def grant(lease_id: str) -> LeaseGrant:
    return LeaseGrant(
        lease_id=lease_id,
        sandbox_id="sb-1",
        url="http://127.0.0.1:9000",
        size=1,
        overflow=False,
        ttl_seconds=60,
    )


async def seed_spare(store: Store, *sandbox_ids: str) -> None:
    """A second app, `spare`, whose pool (`spare-v1`, no minimum) holds these suspended
    sandboxes, suspended after hello's."""
    found = (await pool(store)).value
    spec = found.spec.model_copy(update={"concurrency": Concurrency()})
    spare = found.model_copy(
        update={
            "name": "spare-v1",
            "app": "spare",
            "spec": spec,
            "desired_instances": len(sandbox_ids),
        }
    )
    await store.put(keys.app("spare"), App(name="spare", active_version="v1"))
    await store.put(keys.pool("spare-v1"), spare)
    for index, sandbox_id in enumerate(sandbox_ids):
        made = sandbox(sandbox_id, SandboxStatus.RUNNING, 9100 + index)
        update = {
            "pool": "spare-v1",
            "app": "spare",
            "status": SandboxStatus.SUSPENDED,
            "suspended_at": T0 + 10 + index,
        }
        await store.put(keys.sandbox(sandbox_id), made.model_copy(update=update))


async def spare_size(store: Store) -> int:
    found = await store.get(keys.pool("spare-v1"), Pool)
    assert found is not None
    return found.value.desired_instances


async def test_a_sandbox_that_must_stay_is_passed_over_and_the_next_longest_suspended_goes(
    store: Store,
) -> None:
    """sb-1, pinned by its pool's `min_instances`, is the longest suspended (pinned ones are
    never scaled down, so they become it) and holds a lot: it is passed over, and the next
    one listed, of another app, stops in its place, only as much as is over (sb-1's size is
    not what is asked: sb-3 stays), and once only: the same list read again stops nothing
    more (sb-2 counts as given up)."""
    await seed_suspendable(store, {"sb-1": SandboxStatus.SUSPENDED}, desired=1, min_instances=1)
    await seed_spare(store, "sb-2", "sb-3")
    big = Frozen(sandbox="sb-1", memory=1 << 30)
    listed = [big, Frozen(sandbox="sb-2", memory=MiB), Frozen(sandbox="sb-3", memory=MiB)]
    await store.put(
        keys.node("n1"), Node(name="n1", address="127.0.0.1", evict_bytes=MiB, evict=listed)
    )
    activator = make_activator(store)
    async with activator.running(suspend=False):
        await eventually(lambda: evicting(activator) == ["sb-1", "sb-2", "sb-3"])
        assert await activator._suspender.evict() == ["sb-2"]
        assert await activator._suspender.evict() == []  # the same list again
    statuses = [(await record(store, f"sb-{n}")).status for n in (1, 2, 3)]
    assert statuses == [S.SUSPENDED, S.STOPPING, S.SUSPENDED]
    assert (await pool(store)).value.desired_instances == 1
    assert await spare_size(store) == 1


async def test_one_passed_over_for_a_moment_is_not_stopped_too_from_the_same_list(
    store: Store,
) -> None:
    """sb-1's pool is growing (a sandbox of it boots), so sb-1 is passed over and sb-2 goes
    in its place. The pool then settles, and the same list, read again before the node
    writes the next, must stop nothing: sb-2, further down, already gave up what was asked."""
    await seed_suspendable(
        store,
        {"sb-1": SandboxStatus.SUSPENDED, "sb-0": SandboxStatus.BOOTING},
        desired=2,
    )
    await seed_spare(store, "sb-2", "sb-3")
    await store.put(keys.node("n1"), asks(MiB, "sb-1", "sb-2", "sb-3"))
    activator = make_activator(store)
    async with activator.running(suspend=False):
        await eventually(lambda: evicting(activator) == ["sb-1", "sb-2", "sb-3"])
        assert await activator._suspender.evict() == ["sb-2"]
        booted = await record(store, "sb-0")
        settled = booted.model_copy(update={"status": S.RUNNING, "ready": True})
        await store.put(keys.sandbox("sb-0"), settled)
        await eventually(lambda: activator.snapshot()[0].ready == 1)
        assert await activator._suspender.evict() == []  # stale: sb-2 counts
    statuses = [(await record(store, f"sb-{n}")).status for n in (1, 2, 3)]
    assert statuses == [S.SUSPENDED, S.STOPPING, S.SUSPENDED]
    assert (await pool(store)).value.desired_instances == 2
