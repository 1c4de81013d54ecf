"""The real activator on each store (memory, sqlite, etcd): docs/architecture.md, invariants 1-6."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from tests.support.activator import (
    POOL_KEY,
    make_activator,
    pool,
    sandbox,
    seed,
    set_status,
    settle,
)
from tests.support.waiting import eventually
from wakeful.activator.ledger import Lease
from wakeful.domain import keys
from wakeful.domain.leases import (
    AppFailedToBoot,
    LeaseGone,
    NoCapacity,
    Overloaded,
    UnknownApp,
)
from wakeful.domain.models import App, AppState, Pool, SandboxStatus, StateSpec
from wakeful.store import Event, Put, Require, Store, open_store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_35_waiters_grow_the_pool_in_one_step_and_are_all_admitted_when_ready(
    store: Store,
) -> None:
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    start = (await pool(store)).revision
    pool_writes = store.watch(keys.POOLS, start + 1)
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(), anyio.create_task_group() as requests:
        for _ in range(35):
            requests.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 35)
        with anyio.fail_after(10):
            write = await pool_writes.__anext__()
        assert isinstance(write, Event)
        grown = write.decode(Pool)
        assert grown.desired_instances == 8  # ceil((0 + 35 + 1) / 5), not +3
        # Why, in the same write (the dashboard's scale event).
        assert grown.last_scale is not None
        assert (grown.last_scale.by, grown.last_scale.from_instances) == ("demand", 1)
        assert grown.last_scale.to_instances == 8
        assert grown.last_scale.reason == "demand: 0 leased + 35 waiting at 5 per sandbox"
        assert leases == []  # nothing routable yet: everyone waits

        await set_status(store, "sb-1", SandboxStatus.RUNNING)
        await eventually(lambda: len(leases) == 35)
    assert {lease.sandbox_id for lease in leases} == {"sb-1"}
    # Each waited while nothing was ready: each grant says how long (`Server-Timing: wake`).
    assert all(lease.woke_after > 0 for lease in leases)
    assert sum(not lease.overflow for lease in leases) == 5  # the target's worth
    assert all(lease.size == 1 for lease in leases if lease.overflow)
    snapshot = activator.snapshot()[0]
    assert (snapshot.waiters, snapshot.leased, snapshot.overflow) == (0, 35, 30)
    assert (await pool(store)).value.desired_instances == 8
    # exactly one pool write: the demand after admission (35 leased) is already covered
    current = (await pool(store)).revision
    assert current == write.revision
    await pool_writes.aclose()  # type: ignore[attr-defined]


async def test_a_waiter_is_never_counted_as_both_a_lease_and_a_waiter(store: Store) -> None:
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    done: list[Lease] = []
    worst = 0

    async def acquire() -> None:
        done.append(await activator.acquire("hello"))

    async def sample() -> None:
        nonlocal worst
        while True:
            snapshot = activator.snapshot()[0]
            worst = max(worst, snapshot.leased + snapshot.waiters)
            await anyio.lowlevel.checkpoint()

    async with activator.running(), anyio.create_task_group() as tasks:
        for _ in range(20):
            tasks.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 20)
        tasks.start_soon(sample)
        await set_status(store, "sb-1", SandboxStatus.RUNNING)
        await eventually(lambda: len(done) == 20)
        tasks.cancel_scope.cancel()
    assert worst == 20


async def test_a_scale_up_racing_a_concurrent_write_never_undoes_it(store: Store) -> None:
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    async with activator.running(watch=False), anyio.create_task_group() as requests:
        # Another writer (a deploy, an operator) moves the pool to 12 after the activator
        # listed it; the activator's view still says 1.
        listed = await pool(store)
        await store.update(
            POOL_KEY, listed.value.model_copy(update={"desired_instances": 12}), listed.revision
        )
        for _ in range(10):  # demand for ceil((10 + 1) / 5) = 3
            requests.start_soon(activator.acquire, "hello")
        await eventually(lambda: activator.snapshot()[0].desired_instances == 12)
        requests.cancel_scope.cancel()
    assert (await pool(store)).value.desired_instances == 12


async def test_a_scale_up_after_a_conflict_decides_again_from_the_fresh_pool(store: Store) -> None:
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    async with activator.running(watch=False), anyio.create_task_group() as requests:
        listed = await pool(store)
        await store.update(
            POOL_KEY,
            listed.value.model_copy(update={"desired_instances": 2, "crash_count": 1}),
            listed.revision,
        )
        for _ in range(10):
            requests.start_soon(activator.acquire, "hello")
        await eventually(lambda: activator.snapshot()[0].desired_instances == 3)
        requests.cancel_scope.cancel()
    final = (await pool(store)).value
    assert final.desired_instances == 3
    assert final.crash_count == 1  # the concurrent writer's change survives


async def test_a_missed_scale_down_heals_through_the_reread(store: Store) -> None:
    await seed(store, rpi=5, desired=5)
    activator = make_activator(store)
    async with activator.running(watch=False), anyio.create_task_group() as requests:
        # The idle monitor scaled the pool to zero and the activator missed it: its cache
        # claims 5 sandboxes while none is live.
        listed = await pool(store)
        await store.update(
            POOL_KEY, listed.value.model_copy(update={"desired_instances": 0}), listed.revision
        )
        requests.start_soon(activator.acquire, "hello")
        with anyio.fail_after(10):
            async for change in store.watch(keys.POOLS, listed.revision + 2):
                assert isinstance(change, Event)
                break
        requests.cancel_scope.cancel()
    assert (await pool(store)).value.desired_instances == 1


async def test_a_resync_refreshes_a_stale_view_and_wakes_parked_waiters(store: Store) -> None:
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(watch=False), anyio.create_task_group() as requests:
        requests.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        await set_status(store, "sb-1", SandboxStatus.RUNNING)
        listed = await pool(store)
        await store.update(
            POOL_KEY, listed.value.model_copy(update={"desired_instances": 4}), listed.revision
        )
        await anyio.sleep(0.05)
        assert leases == []  # the view is stale: no watch runs
        await activator.resync()
        await eventually(lambda: len(leases) == 1)
    assert leases[0].sandbox_id == "sb-1"
    assert activator.snapshot()[0].desired_instances == 4


async def test_the_watch_loop_relists_after_a_resync_event() -> None:
    async with open_store("memory://") as store:
        await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.BOOTING})
        activator = make_activator(store)
        leases: list[Lease] = []

        async def acquire() -> None:
            leases.append(await activator.acquire("hello"))

        async with activator.running(), anyio.create_task_group() as requests:
            requests.start_soon(acquire)
            await eventually(lambda: activator.snapshot()[0].waiters == 1)
            # Two writes and a compaction without yielding to the loop: the watcher's next
            # read is behind the history, so it gets Resync and must re-list.
            await set_status(store, "sb-1", SandboxStatus.DEAD)
            latest = await set_status(store, "sb-1", SandboxStatus.RUNNING)
            await store.compact(latest)
            await eventually(lambda: len(leases) == 1)
        assert leases[0].sandbox_id == "sb-1"


async def test_released_and_expired_leases_return_their_capacity(store: Store) -> None:
    await seed(store, rpi=10, sandboxes={"sb-1": SandboxStatus.RUNNING})
    clock = ManualClock()
    activator = make_activator(store, clock=clock, lease_ttl=60)
    async with activator.running():
        first = await activator.acquire("hello")
        second = await activator.acquire("hello")
        assert (first.size, second.size) == (2, 2)
        assert activator.leased_on("sb-1") == 4
        activator.release(first.lease_id)
        activator.release(first.lease_id)  # idempotent
        assert activator.leased_on("sb-1") == 2

        clock.advance(45)
        activator.renew(second.lease_id)
        clock.advance(45)  # 90 s after the grant, 45 after the renew
        assert activator.expire_leases() == 0
        clock.advance(16)
        assert activator.expire_leases() == 1
        assert activator.leased_on("sb-1") == 0
        with pytest.raises(LeaseGone):
            activator.renew(second.lease_id)


async def test_the_last_lease_on_a_draining_sandbox_nudges_the_pool_controller(
    store: Store,
) -> None:
    """Lease releases are not store changes: without a nudge the controller would stop a
    drained sandbox only at its next tick (up to a second of every move and drain)."""
    await seed(store, rpi=10, sandboxes={"sb-1": SandboxStatus.RUNNING})
    activator = make_activator(store)
    nudges: list[str] = []
    activator.last_lease_gone = lambda: nudges.append("nudge")
    async with activator.running():
        first = await activator.acquire("hello")
        second = await activator.acquire("hello")
        activator.release(first.lease_id)
        assert nudges == []  # routable: nothing waits for its leases
        third = await activator.acquire("hello")
        await set_status(store, "sb-1", SandboxStatus.DRAINING)
        await eventually(lambda: not activator.snapshot()[0].ready)
        activator.release(second.lease_id)
        assert nudges == []  # one lease still on it
        activator.release(third.lease_id)
        assert nudges == ["nudge"]


async def test_a_dead_sandbox_drops_its_leases(store: Store) -> None:
    await seed(store, rpi=10, sandboxes={"sb-1": SandboxStatus.RUNNING})
    activator = make_activator(store)
    async with activator.running():
        lease = await activator.acquire("hello")
        await set_status(store, "sb-1", SandboxStatus.DEAD)
        await eventually(lambda: activator.leased_on("sb-1") == 0)
        with pytest.raises(LeaseGone):
            activator.renew(lease.lease_id)


async def test_a_sandbox_record_that_stops_validating_counts_as_gone(store: Store) -> None:
    """Uniform with every reflector view: an invalid record is absent, its leases end, and the
    view goes on following the other records."""
    await seed(store, rpi=10, sandboxes={"sb-1": SandboxStatus.RUNNING})
    activator = make_activator(store)
    async with activator.running():
        lease = await activator.acquire("hello")
        await store.put(keys.sandbox("sb-1"), App(name="not-a-sandbox"))
        await eventually(lambda: activator.snapshot()[0].ready == 0)
        with pytest.raises(LeaseGone):
            activator.renew(lease.lease_id)
        await set_status(store, "sb-2", SandboxStatus.RUNNING, port=9001)
        assert (await activator.acquire("hello")).sandbox_id == "sb-2"


async def test_bounds_unknown_apps_a_full_queue_and_the_activation_timeout(store: Store) -> None:
    await seed(store, rpi=5, activation_timeout=120, sandboxes={"sb-1": SandboxStatus.BOOTING})
    clock = ManualClock()
    activator = make_activator(store, clock=clock, max_waiters=3)
    timed_out: list[NoCapacity] = []

    async def wait_for_capacity() -> None:
        with pytest.raises(NoCapacity) as failed:
            await activator.acquire("hello")
        timed_out.append(failed.value)

    async with activator.running():
        with pytest.raises(UnknownApp):
            await activator.acquire("nope")

        with anyio.fail_after(10):
            async with anyio.create_task_group() as requests:
                requests.start_soon(wait_for_capacity)
                await eventually(lambda: activator.snapshot()[0].waiters == 1)
                clock.advance(119.9)
                activator.expire_leases()
                await settle()
                assert (timed_out, activator.snapshot()[0].waiters) == ([], 1)  # not yet
                clock.advance(0.1)
                activator.expire_leases()  # the deadline passed: the waiter gives up
        (failure,) = timed_out
        assert failure.retry_after >= 1
        assert activator.snapshot()[0].waiters == 0

        async with anyio.create_task_group() as requests:
            for _ in range(3):
                requests.start_soon(activator.acquire, "hello")
            await eventually(lambda: activator.snapshot()[0].waiters == 3)
            with pytest.raises(Overloaded):
                await activator.acquire("hello")
            requests.cancel_scope.cancel()
        assert activator.snapshot()[0].waiters == 0  # cancelled waiters leave the queue


async def test_a_crash_looping_app_fails_fast_with_its_log(store: Store) -> None:
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.DEAD})
    listed = await pool(store)
    wall = ManualClock(1_700_000_000.0)  # the pool controller writes wall-clock times
    crashed = listed.value.model_copy(
        update={
            "crash_count": 3,
            "crash_cooldown_until": wall.now + 8,
            "last_crash_log": "ImportError: no module named flask",
        }
    )
    await store.update(POOL_KEY, crashed, listed.revision)
    activator = make_activator(store, wall_clock=wall)
    async with activator.running():
        with anyio.fail_after(2), pytest.raises(AppFailedToBoot) as failed:
            await activator.acquire("hello")
        assert [p.crashes for p in activator.snapshot()] == [3]  # `wakeful status` shows it
    assert "flask" in failed.value.log
    assert failed.value.retry_after == 8


async def test_a_stateful_app_whose_state_a_node_keeps_fails_fast_saying_so(
    store: Store,
) -> None:
    """Its one sandbox cannot start until an operator frees the state: a request is answered
    at once (not after the activation budget), without the node's reason (public)."""
    await seed(store, rpi=5, max_instances=1)
    listed = await pool(store)
    spec = listed.value.spec.model_copy(update={"state": StateSpec(path="data")})
    await store.update(POOL_KEY, listed.value.model_copy(update={"spec": spec}), listed.revision)
    kept = AppState(app="hello", node="n1", epoch=3, kept=True, error="/var/x: too large")
    await store.put(keys.state("hello"), kept)
    activator = make_activator(store)
    async with activator.running():
        with anyio.fail_after(2), pytest.raises(NoCapacity) as refused:
            await activator.acquire("hello")
    assert "keeps state that node n1 could not hand back" in str(refused.value)
    assert "wakeful release-state hello" in str(refused.value)
    assert "/var/x" not in str(refused.value) and refused.value.retry_after == 60


async def test_a_request_waiting_on_a_retired_pool_follows_the_route_to_the_new_one(
    store: Store,
) -> None:
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(), anyio.create_task_group() as requests:
        requests.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        old = await pool(store)
        new = old.value.model_copy(update={"name": "hello-v2", "version": "v2"})
        await store.put(keys.pool("hello-v2"), new)
        await store.put(
            keys.sandbox("sb-2"),
            sandbox("sb-2", SandboxStatus.RUNNING, 9100).model_copy(update={"pool": "hello-v2"}),
        )
        app = await store.get(keys.app("hello"), App)
        assert app is not None
        await store.txn(
            [Require(keys.app("hello"), app.revision), Require(POOL_KEY, old.revision)],
            [
                Put(keys.app("hello"), app.value.model_copy(update={"active_version": "v2"})),
                Put(POOL_KEY, old.value.model_copy(update={"retired": True})),
            ],
        )
        await eventually(lambda: len(leases) == 1)
    assert leases[0].sandbox_id == "sb-2"
    assert all(s.waiters == 0 for s in activator.snapshot())


async def test_a_request_for_a_split_version_goes_to_its_pool_and_one_no_longer_routed_follows(
    store: Store,
) -> None:
    """Issue 39: an ingress names the version its split picked; a version the app no longer
    routes (the ingress's split is older than the activator's view; the change retired its
    pool) follows the app's route to the active version instead of failing."""
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.RUNNING})
    old = await pool(store)
    await store.put(
        keys.pool("hello-v2"), old.value.model_copy(update={"name": "hello-v2", "version": "v2"})
    )
    await store.put(
        keys.sandbox("sb-2"),
        sandbox("sb-2", SandboxStatus.RUNNING, 9100).model_copy(update={"pool": "hello-v2"}),
    )
    app = await store.get(keys.app("hello"), App)
    assert app is not None and app.value.active_version == "v1"
    split = app.value.model_copy(update={"split": {"v1": 50, "v2": 50}})
    await store.put(keys.app("hello"), split)
    activator = make_activator(store)
    async with activator.running():
        on_v2 = await activator.acquire("hello", "v2")
        assert (on_v2.sandbox_id, on_v2.grant().version) == ("sb-2", "v2")
        assert (await activator.acquire("hello", "v1")).sandbox_id == "sb-1"
        v2 = await store.get(keys.pool("hello-v2"), Pool)
        assert v2 is not None
        await store.txn(
            [],
            [
                Put(keys.app("hello"), split.model_copy(update={"split": {}})),
                Put(v2.key, v2.value.model_copy(update={"retired": True})),
            ],
        )
        await eventually(
            lambda: all(s.state != "active" for s in activator.snapshot() if s.pool == "hello-v2")
        )
        followed = await activator.acquire("hello", "v2")
        # On v1, and saying so: the ingress caches it as v1's (`ingress.cacherules.kept_under`).
        assert (followed.sandbox_id, followed.grant().version) == ("sb-1", "v1")


async def test_a_view_caught_mid_change_of_route_is_waited_out_never_a_404(
    store: Store,
) -> None:
    """A pool record read ahead of its app's (a scale-up's re-read during a traffic change,
    issue 39): the app's active version has no serving pool for a moment. The request waits
    for the app's record and is served; one that never settles is a 503, never a 404."""
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.RUNNING})
    old = await pool(store)
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(), anyio.create_task_group() as requests:
        await store.put(POOL_KEY, old.value.model_copy(update={"retired": True}))
        await eventually(lambda: all(s.state != "active" for s in activator.snapshot()))
        requests.start_soon(acquire)
        await anyio.sleep(0.2)
        assert leases == []  # waiting, not refused
        await store.put(
            keys.pool("hello-v2"),
            old.value.model_copy(update={"name": "hello-v2", "version": "v2", "retired": False}),
        )
        await store.put(
            keys.sandbox("sb-2"),
            sandbox("sb-2", SandboxStatus.RUNNING, 9100).model_copy(update={"pool": "hello-v2"}),
        )
        app = await store.get(keys.app("hello"), App)
        assert app is not None
        await store.put(keys.app("hello"), app.value.model_copy(update={"active_version": "v2"}))
        await eventually(lambda: len(leases) == 1)
        assert leases[0].sandbox_id == "sb-2"
        v2 = await store.get(keys.pool("hello-v2"), Pool)
        assert v2 is not None
        await store.put(v2.key, v2.value.model_copy(update={"retired": True}))
        await eventually(
            lambda: all(s.state != "active" for s in activator.snapshot() if s.pool == "hello-v2")
        )
        with pytest.raises(NoCapacity, match="no pool serving version 'v2'"):
            await activator.acquire("hello")


async def test_past_the_hard_limit_a_request_waits_drives_a_scale_up_and_takes_freed_room(
    store: Store,
) -> None:
    """Invariant 1 as amended: with `hard_limit`, a request waits when every routable sandbox
    is at it (instead of taking an overflow lease there), its wait counts in the scale-up, and
    a release lets it in."""
    await seed(store, rpi=2, hard_limit=3, sandboxes={"sb-1": SandboxStatus.RUNNING})
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(), anyio.create_task_group() as requests:
        for _ in range(3):
            leases.append(await activator.acquire("hello"))
        assert activator.leased_on("sb-1") == 3  # the hard limit: overflow up to it, no further
        requests.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        # ceil((3 leased + 1 waiter + 1 of headroom) / 2): the waiter is demand
        await eventually(lambda: activator.snapshot()[0].desired_instances == 3)
        assert len(leases) == 3
        activator.release(leases[0].lease_id)
        await eventually(lambda: len(leases) == 4)
    assert leases[3].sandbox_id == "sb-1"
    assert activator.leased_on("sb-1") == 3
    # It waited for room on a ready sandbox, not for a wake: `Server-Timing` says no wake.
    assert leases[3].woke_after == 0 and leases[3].grant().woke_after == 0
