"""The pool controller's shell against a real store."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.support.waiting import eventually
from wakeful.controller.metrics import TunnelCollector
from wakeful.controller.mirror import Mirror, SecretsRestart
from wakeful.controller.reconciler import Reconciler
from wakeful.domain import keys
from wakeful.domain.models import (
    AppSecrets,
    AppSpec,
    Node,
    Pool,
    ReplicaCoverage,
    Sandbox,
    SandboxStatus,
    SealedValue,
    Tunnel,
)
from wakeful.secrets.book import SecretBook, SecretEnv
from wakeful.secrets.keys import KeyRing
from wakeful.store import Item, Store

pytestmark = pytest.mark.anyio


async def seed(store: Store, desired: int, *sandboxes: Sandbox) -> None:
    await store.put("nodes/n1", Node(name="n1", address="127.0.0.1"))
    pool = Pool(
        name="p", app="a", version="v1", spec=AppSpec(command=["x"]), desired_instances=desired
    )
    await store.put("pools/p", pool)
    for sandbox in sandboxes:
        await store.put(f"sandboxes/{sandbox.id}", sandbox)


async def statuses(store: Store) -> dict[str, SandboxStatus]:
    return {i.value.id: i.value.status for i in (await store.list("sandboxes/", Sandbox)).items}


async def test_grows_a_pool_with_placed_records(store: Store) -> None:
    await seed(store, 2)
    await Reconciler(store, lambda sandbox_id: 0).tick()
    created = (await store.list("sandboxes/", Sandbox)).items
    assert len(created) == 2
    assert {(s.value.node, s.value.status) for s in created} == {("n1", SandboxStatus.PENDING)}


async def test_a_created_sandbox_carries_a_placement_the_key_ring_verifies(
    store: Store, tmp_path: Path
) -> None:
    """Issue 35: only the control plane says which node may start which app's sandbox. The
    controller signs each record it creates with the placer it was given (the key ring's, as
    `wakeful.bootstrap` wires it); the book then answers the node for it, and for no other."""
    ring = KeyRing(store, tmp_path / "keys")
    await ring.start()
    await seed(store, 2)
    await store.put(keys.secrets("a"), AppSecrets(app="a", generation=2, restart_generation=2))
    await Reconciler(store, lambda sandbox_id: 0, placer=ring.place).tick()
    created = [i.value for i in (await store.list(keys.SANDBOXES, Sandbox)).items]
    assert len(created) == 2
    assert all(s.secrets_generation == 2 and ring.placed(s) for s in created)
    assert not ring.placed(created[0].model_copy(update={"node": "n2"}))
    assert created[0].placement != created[1].placement
    book = SecretBook(store, ring)
    for sandbox in created:
        assert await book.env_for("n1", sandbox.id) == SecretEnv(2, {})


async def test_a_draining_sandbox_stops_only_when_its_leases_are_gone(store: Store) -> None:
    draining = Sandbox(
        id="s1", pool="p", app="a", node="n1", status=SandboxStatus.DRAINING, address="127.0.0.1:1"
    )
    await seed(store, 0, draining)
    leased = {"s1": 1}
    reconciler = Reconciler(store, lambda sandbox_id: leased.get(sandbox_id, 0))
    await reconciler.tick()
    assert await statuses(store) == {"s1": SandboxStatus.DRAINING}
    leased["s1"] = 0
    await reconciler.tick()
    assert await statuses(store) == {"s1": SandboxStatus.STOPPING}


async def test_after_a_restart_lease_counts_are_trusted_only_after_the_grace(
    store: Store,
) -> None:
    draining = Sandbox(
        id="s1", pool="p", app="a", node="n1", status=SandboxStatus.DRAINING, address="127.0.0.1:1"
    )
    await seed(store, 0, draining)
    now = [1000.0]
    reconciler = Reconciler(store, lambda sandbox_id: 0, drain_grace=60, clock=lambda: now[0])
    await reconciler.tick()  # a fresh activator reads 0 leases: an ingress may still hold some
    assert await statuses(store) == {"s1": SandboxStatus.DRAINING}
    now[0] += 61
    await reconciler.tick()
    assert await statuses(store) == {"s1": SandboxStatus.STOPPING}


async def test_crashes_start_a_cooldown_with_the_log_and_the_record_goes(store: Store) -> None:
    crashed = Sandbox(
        id="s1",
        pool="p",
        app="a",
        node="n1",
        status=SandboxStatus.DEAD,
        last_log="ImportError: flask",
    )
    await seed(store, 1, crashed)
    await Reconciler(store, lambda sandbox_id: 0, clock=lambda: 1000.0).tick()
    pool = await store.get("pools/p", Pool)
    assert pool is not None
    assert pool.value.crash_count == 1
    assert pool.value.crash_cooldown_until == 1001.0
    assert "flask" in pool.value.last_crash_log
    assert await statuses(store) == {}  # removed, and no replacement during the cooldown


async def test_a_sandbox_on_a_gone_node_is_released_at_a_new_epoch_and_replaced(
    store: Store,
) -> None:
    orphan = Sandbox(
        id="s1",
        pool="p",
        app="a",
        node="gone",
        owner="gone",
        epoch=3,
        status=SandboxStatus.RUNNING,
        ready=True,
        address="127.0.0.1:1",
    )
    await seed(store, 1, orphan)
    reconciler = Reconciler(store, lambda sandbox_id: 0)
    await reconciler.tick()
    released = await store.get("sandboxes/s1", Sandbox)
    assert released is not None
    assert (released.value.status, released.value.owner, released.value.epoch) == (
        SandboxStatus.DEAD,
        None,
        4,
    )
    created = [
        s.value for s in (await store.list("sandboxes/", Sandbox)).items if s.value.id != "s1"
    ]
    assert [(s.node, s.owner, s.epoch) for s in created] == [("n1", "n1", 1)]
    await reconciler.tick()
    assert await store.get("sandboxes/s1", Sandbox) is None  # no record no node lists remains


async def test_a_sandbox_that_never_ran_on_a_vanished_node_is_not_a_crash(store: Store) -> None:
    # A node stopped (or died) before starting what was placed on it: the app is not at fault.
    never_ran = Sandbox(id="s1", pool="p", app="a", node="gone", owner="gone", epoch=1)
    await seed(store, 1, never_ran)
    reconciler = Reconciler(store, lambda sandbox_id: 0)
    await reconciler.tick()  # marked dead, ownership released
    await reconciler.tick()  # removed, and replaced without any cooldown
    pool = await store.get("pools/p", Pool)
    assert pool is not None and pool.value.crash_count == 0
    assert [s.value.node for s in (await store.list("sandboxes/", Sandbox)).items] == ["n1"]


async def test_a_released_sandbox_nobody_took_is_cleaned_up(store: Store) -> None:
    released = Sandbox(
        id="s1",
        pool="p",
        app="a",
        node="n1",
        owner=None,
        epoch=2,
        status=SandboxStatus.RUNNING,
        ready=True,
        address="127.0.0.1:1",
    )
    await seed(store, 1, released)
    reconciler = Reconciler(store, lambda sandbox_id: 0)
    await reconciler.tick()
    await reconciler.tick()
    assert await store.get("sandboxes/s1", Sandbox) is None
    remaining = [s.value for s in (await store.list("sandboxes/", Sandbox)).items]
    assert [(s.owner, s.epoch) for s in remaining] == [("n1", 1)]


async def mirrored(store: Store) -> Mirror:
    """A `Mirror` as the watch would have filled it, listed from the store now."""
    mirror = Mirror()
    pools = await store.list("pools/", Pool)
    mirror.pools.replace(pools.items, pools.revision)
    nodes = await store.list("nodes/", Node)
    mirror.nodes.replace(nodes.items, nodes.revision)
    sandboxes = await store.list("sandboxes/", Sandbox)
    mirror.sandboxes.replace(sandboxes.items, sandboxes.revision)
    mirror.cordons.replace([], sandboxes.revision)
    mirror.states.replace([], sandboxes.revision)
    secrets = await store.list("secrets/", SecretsRestart)
    mirror.secrets.replace(secrets.items, secrets.revision)
    mirror.done_listing()
    return mirror


async def test_it_plans_from_its_mirror_only_when_the_mirror_has_its_own_writes(
    store: Store,
) -> None:
    """Running, the controller plans from what its watch delivered (`Mirror`), not from a
    listing per tick. A watch lags (etcd's by a network round trip): a plan from a mirror
    without the sandboxes the controller just created would create them again, so such a
    mirror is not planned from."""
    await seed(store, 2)
    stale = await mirrored(store)
    reconciler = Reconciler(store, lambda sandbox_id: 0)
    await reconciler.tick()
    assert len(await statuses(store)) == 2
    await reconciler.step(stale)  # the watch has not delivered the two creates yet
    assert len(await statuses(store)) == 2
    current = await mirrored(store)
    # What the mirror says is what is planned from: a pool it holds at 3 gets a third.
    pool = current.pools.items["pools/p"]
    current.pools.put(
        Item(pool.key, pool.value.model_copy(update={"desired_instances": 3}), pool.revision)
    )
    await reconciler.step(current)
    assert len(await statuses(store)) == 3


async def test_a_mirror_listed_table_by_table_is_as_old_as_its_oldest_table(store: Store) -> None:
    """Found by a reviewer: a listing replaces the tables one by one; the sandboxes listed
    before the controller's own create, the nodes after it. Planned from as if it were as new
    as its newest table, it created the sandboxes again."""
    await seed(store, 2)
    mirror = Mirror()
    mirror.relisting()
    sandboxes = await store.list("sandboxes/", Sandbox)  # before the creates
    mirror.sandboxes.replace(sandboxes.items, sandboxes.revision)
    reconciler = Reconciler(store, lambda sandbox_id: 0)
    await reconciler.tick()  # creates two, at revisions past that listing
    assert len(await statuses(store)) == 2
    pools = await store.list("pools/", Pool)
    mirror.pools.replace(pools.items, pools.revision)
    nodes = await store.list("nodes/", Node)
    mirror.nodes.replace(nodes.items, nodes.revision)
    mirror.cordons.replace([], nodes.revision)
    mirror.states.replace([], nodes.revision)
    mirror.secrets.replace([], nodes.revision)
    mirror.done_listing()
    await reconciler.step(mirror)
    assert len(await statuses(store)) == 2


def test_dial_out_nodes_streams_and_coverage_actions_are_in_the_control_planes_metrics() -> None:
    """A node behind NAT cannot be scraped: its coverage table, published in its record, is
    what the control plane's /metrics shows (invariant 22)."""
    mirror = Mirror()
    table = Tunnel(
        reachable=True,
        replicas=[
            ReplicaCoverage(replica="r1", streams=10, busy=3, budget=5, state="covered"),
            ReplicaCoverage(replica="r2", streams=1, busy=1, budget=3, state="growing"),
        ],
        actions={"grow": 8, "prune": 2},
    )
    mirror.nodes.put(Item("nodes/n9", Node(name="n9", address="", tunnel=table), 1))
    mirror.nodes.put(Item("nodes/n1", Node(name="n1", address="a"), 2))  # dialed: not listed
    registry = CollectorRegistry()
    registry.register(TunnelCollector(lambda: mirror))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("wakeful_node_tunnel_streams", node="n9", replica="r1", state="busy") == 3
    assert sample("wakeful_node_tunnel_streams", node="n9", replica="r1", state="idle") == 7
    assert sample("wakeful_node_tunnel_coverage", node="n9", replica="r2", state="growing") == 1
    assert sample("wakeful_node_tunnel_reachable", node="n9") == 1
    assert sample("wakeful_node_tunnel_coverage_actions_total", node="n9", action="grow") == 8
    assert sample("wakeful_node_tunnel_reachable", node="n1") is None


# -- a secrets change that restarts the app's sandboxes ---------------------------------------


def running(sandbox_id: str, pool: str, app: str, node: str) -> Sandbox:
    return Sandbox(
        id=sandbox_id,
        pool=pool,
        app=app,
        node=node,
        owner=node,
        epoch=1,
        status=SandboxStatus.RUNNING,
        ready=True,
        address="127.0.0.1:1",
    )


async def node_turn(store: Store) -> None:
    """What the nodes do between two ticks: start what is placed (pending, then booting, then
    running and ready) and finish what is stopping."""
    after = {
        SandboxStatus.PENDING: {"status": SandboxStatus.BOOTING},
        SandboxStatus.BOOTING: {"status": SandboxStatus.RUNNING, "ready": True, "address": "x:1"},
        SandboxStatus.STOPPING: {"status": SandboxStatus.STOPPED},
    }
    for item in (await store.list(keys.SANDBOXES, Sandbox)).items:
        update = after.get(item.value.status)
        if update is not None:
            await store.update(item.key, item.value.model_copy(update=update), item.revision)


async def test_a_restarting_secrets_change_replaces_every_live_pool_of_the_app_serving_throughout(
    store: Store,
) -> None:
    """Issue 35: `wakeful secrets set` bumps `restart_generation`; every sandbox of every live
    pool of the app (two versions mid-rollout here) is replaced, each pool never routing to
    fewer sandboxes than it had; a retired pool's draining sandbox and another app's are left
    alone. Planned alternately from fresh listings and from a mirror."""
    for name in ("n1", "n2"):
        await store.put(keys.node(name), Node(name=name, address=name))
    spec = AppSpec(command=["x"])
    sizes = {"a-v1": 2, "a-v2": 1, "b-v1": 1}
    for name, size in sizes.items():
        app, version = name.split("-")
        await store.put(
            keys.pool(name),
            Pool(name=name, app=app, version=version, spec=spec, desired_instances=size),
        )
        for i in range(size):
            await store.put(
                keys.sandbox(f"{name}-old{i}"), running(f"{name}-old{i}", name, app, "n1")
            )
    retired = Pool(name="a-v0", app="a", version="v0", spec=spec, retired=True, retired_at=1.0)
    await store.put(keys.pool("a-v0"), retired)
    long_request = running("a-v0-old0", "a-v0", "a", "n1").model_copy(
        update={"status": SandboxStatus.DRAINING, "ready": False}
    )
    await store.put(keys.sandbox(long_request.id), long_request)
    await store.put(keys.secrets("a"), AppSecrets(app="a", generation=1, restart_generation=1))

    drained_at: dict[str, int] = {}
    rounds = [0]

    def leased_on(sandbox_id: str) -> int:
        """A running sandbox holds a lease; a drained one's last lease ends a round after its
        drain; the retired pool's long request never ends."""
        if sandbox_id == long_request.id:
            return 1
        return 1 if drained_at.get(sandbox_id, rounds[0]) >= rounds[0] else 0

    async def check() -> list[Sandbox]:
        sandboxes = [i.value for i in (await store.list(keys.SANDBOXES, Sandbox)).items]
        for sandbox in sandboxes:
            if sandbox.status is SandboxStatus.DRAINING:
                drained_at.setdefault(sandbox.id, rounds[0])
        for name, size in sizes.items():
            routable = sum(1 for s in sandboxes if s.pool == name and s.routable)
            assert routable >= size, f"{name} routed to {routable} of {size} in round {rounds[0]}"
        return sandboxes

    reconciler = Reconciler(store, leased_on)
    for rounds[0] in range(1, 16):
        if rounds[0] % 2:
            await reconciler.tick()
        else:
            await reconciler.step(await mirrored(store))
        await check()
        await node_turn(store)
        sandboxes = await check()
        fresh = [s for s in sandboxes if s.app == "a" and s.pool != "a-v0"]
        if all(s.secrets_generation == 1 and s.routable for s in fresh) and len(fresh) == 3:
            break
    else:
        left = [(s.id, s.status.value, s.secrets_generation) for s in sandboxes]
        raise AssertionError(f"not replaced: {left}")
    by_pool: dict[str, list[str]] = defaultdict(list)
    for sandbox in sandboxes:
        by_pool[sandbox.pool].append(sandbox.id)
    assert {name: len(ids) for name, ids in by_pool.items()} == {
        "a-v1": 2,
        "a-v2": 1,
        "b-v1": 1,
        "a-v0": 1,
    }
    assert not any("old" in i for i in by_pool["a-v1"] + by_pool["a-v2"])
    assert by_pool["b-v1"] == ["b-v1-old0"]  # no secrets record: generation 0, up to date
    assert by_pool["a-v0"] == ["a-v0-old0"]  # retired, still draining its long request


async def test_a_sandbox_created_records_the_generation_its_watch_delivered(store: Store) -> None:
    """Running (planning from its mirror, kept by the watch of `secrets/` among others), the
    controller creates sandboxes at the app's current `restart_generation`, and replaces one
    behind it when a change arrives."""
    await seed(store, 1)
    sealed = SealedValue(sealed="v1:0123456789ab:" + "A" * 44, set_at=1.0, set_by="admin")
    await store.put(
        keys.secrets("a"),
        AppSecrets(app="a", values={"TOKEN": sealed}, generation=3, restart_generation=2),
    )
    reconciler = Reconciler(store, lambda sandbox_id: 0, interval=0.05)

    async def generations() -> list[tuple[int, SandboxStatus]]:
        items = (await store.list(keys.SANDBOXES, Sandbox)).items
        return sorted((i.value.secrets_generation, i.value.status) for i in items)

    seen: list[list[tuple[int, SandboxStatus]]] = [[]]

    async def poll() -> None:
        while True:
            seen[0] = await generations()
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reconciler.run)
        tasks.start_soon(poll)
        await eventually(lambda: seen[0] == [(2, SandboxStatus.PENDING)])
        mirror = reconciler.mirror
        assert mirror is not None  # what it keeps of the record: the generation, no value
        kept = [SecretsRestart(app="a", restart_generation=2)]
        await eventually(lambda: [i.value for i in mirror.secrets.items.values()] == kept)
        # Still pending when the next change lands: stopped, and replaced at the new one.
        secrets = await store.get(keys.secrets("a"), AppSecrets)
        assert secrets is not None
        bumped = secrets.value.model_copy(update={"generation": 4, "restart_generation": 3})
        await store.update(secrets.key, bumped, secrets.revision)
        await eventually(
            lambda: seen[0] == [(2, SandboxStatus.STOPPING), (3, SandboxStatus.PENDING)]
        )
        tasks.cancel_scope.cancel()
