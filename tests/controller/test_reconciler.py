"""The pool controller's shell against a real store."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from wakeful.controller.metrics import TunnelCollector
from wakeful.controller.mirror import Mirror
from wakeful.controller.reconciler import Reconciler
from wakeful.domain.models import (
    AppSpec,
    Node,
    Pool,
    ReplicaCoverage,
    Sandbox,
    SandboxStatus,
    Tunnel,
)
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
