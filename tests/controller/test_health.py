"""What operators alert on, from the control plane: boot crashes (`CrashCollector`), nodes
gone and whether the store answers (`StoreProbe`), against real stores and a real etcd."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.support.waiting import eventually
from wakeful.controller.health import StoreProbe
from wakeful.controller.reconciler import Reconciler
from wakeful.domain.models import AppSpec, Node, Pool, Sandbox, SandboxStatus, SeenNode
from wakeful.store import Store, open_store
from wakeful.store.etcd import EtcdStore
from wakeful.store.testing import EtcdServer
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


def probed(probe: StoreProbe) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(probe)
    return registry


async def test_a_node_that_registered_once_and_holds_no_registration_is_reported_gone(
    store: Store,
) -> None:
    for name in ("n1", "n2"):
        await store.put(f"seen/{name}", SeenNode(name=name, first_seen=1.0))
    await store.put("nodes/n1", Node(name="n1", address="127.0.0.1"))
    await store.put("nodes/n3", Node(name="n3", address="127.0.0.1"))  # its seen/ not yet
    probe = StoreProbe(store, clock=lambda: 1234.0)
    registry = probed(probe)
    assert registry.get_sample_value("wakeful_store_up") is None  # before the first probe
    assert await probe.probe()
    assert registry.get_sample_value("wakeful_store_up") == 1
    assert registry.get_sample_value("wakeful_store_last_success_timestamp_seconds") == 1234.0
    registered = {
        node: registry.get_sample_value("wakeful_node_registered", {"node": node})
        for node in ("n1", "n2", "n3")
    }
    assert registered == {"n1": 1, "n2": 0, "n3": 1}
    await store.delete("nodes/n1")  # its TTL lease expired
    assert await probe.probe()
    assert registry.get_sample_value("wakeful_node_registered", {"node": "n1"}) == 0


async def test_a_closed_store_is_down_and_the_last_registrations_stay() -> None:
    async with open_store("memory://") as store:
        await store.put("seen/n1", SeenNode(name="n1"))
        await store.put("nodes/n1", Node(name="n1", address="127.0.0.1"))
        probe = StoreProbe(store)
        assert await probe.probe()
    assert not await probe.probe()  # closed: Unavailable
    registry = probed(probe)
    assert registry.get_sample_value("wakeful_store_up") == 0
    assert registry.get_sample_value("wakeful_node_registered", {"node": "n1"}) == 1


@pytest.fixture
async def own_etcd() -> AsyncIterator[tuple[EtcdServer, EtcdStore]]:
    """An etcd of this test's own, to stop, pause and start again."""
    with EtcdServer() as server:
        store = EtcdStore([server.endpoint], namespace="/health/", timeout=2.0)
        await store.connect()
        try:
            yield server, store
        finally:
            await store.aclose()


async def test_the_probe_loop_outlives_an_etcd_that_is_killed_or_silent(
    own_etcd: tuple[EtcdServer, EtcdStore],
) -> None:
    server, store = own_etcd
    probe = StoreProbe(store, interval=0.05, timeout=1.0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(probe.run)
        await eventually(lambda: probe.up is True, within=60)

        server.kill()  # down: connections refused
        await eventually(lambda: probe.up is False, within=60)
        await anyio.to_thread.run_sync(server.start)
        await eventually(lambda: probe.up is True, within=60)

        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)  # silent: connected, never answers
        try:
            await eventually(lambda: probe.up is False, within=60)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        answered = probe.last_success
        await eventually(lambda: probe.up is True and probe.last_success > answered, within=60)
        tasks.cancel_scope.cancel()


async def test_a_pool_crashing_at_boot_is_counted_and_its_cooldown_shown(store: Store) -> None:
    crashed = Sandbox(
        id="s1", pool="p", app="a", node="n1", status=SandboxStatus.DEAD, last_log="boom"
    )
    await store.put("nodes/n1", Node(name="n1", address="127.0.0.1"))
    spec = AppSpec(command=["x"])
    await store.put(
        "pools/p", Pool(name="p", app="a", version="v1", spec=spec, desired_instances=1)
    )
    retired = Pool(name="old", app="a", version="v0", spec=spec, retired=True, crash_count=4)
    await store.put("pools/old", retired)
    await store.put("sandboxes/s1", crashed)
    clock = ManualClock(1000.0)
    registry = CollectorRegistry()
    reconciler = Reconciler(store, lambda sandbox_id: 0, clock=clock, registry=registry)

    def sample(name: str, pool: str = "p") -> float | None:
        return registry.get_sample_value(name, {"app": "a", "pool": pool})

    assert sample("wakeful_pool_crash_count") is None  # no mirror before it runs
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reconciler.run)
        await eventually(lambda: sample("wakeful_pool_crash_count") == 1)
        assert sample("wakeful_pool_crash_cooldown") == 1  # until 1001 (1 s after a first)
        clock.advance(2)
        assert sample("wakeful_pool_crash_cooldown") == 0
        assert sample("wakeful_pool_crash_count", pool="old") is None  # retired: not shown
        tasks.cancel_scope.cancel()
