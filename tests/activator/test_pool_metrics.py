"""Each pool as metrics, read from the real activator when scraped (`PoolCollector`)."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.activator import make_activator, seed, set_status
from tests.support.waiting import eventually
from wakeful.activator.ledger import Lease
from wakeful.activator.pool_metrics import PoolCollector
from wakeful.domain.models import SandboxStatus
from wakeful.store import Store

pytestmark = pytest.mark.anyio
POOL = {"app": "hello", "pool": "hello-v1"}


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {**POOL, **labels})


async def test_a_pool_is_reported_as_the_activator_sees_it(store: Store) -> None:
    await seed(
        store,
        rpi=1,
        desired=2,
        sandboxes={"sb-1": SandboxStatus.RUNNING, "sb-2": SandboxStatus.BOOTING},
    )
    activator = make_activator(store)
    registry = CollectorRegistry()
    registry.register(PoolCollector(activator.snapshot))
    async with activator.running():
        await eventually(lambda: sample(registry, "wakeful_pool_ready_sandboxes") == 1)
        lease = await activator.acquire("hello")
        assert sample(registry, "wakeful_pool_info", version="v1", state="active") == 1
        assert sample(registry, "wakeful_pool_desired_instances") == 2
        assert sample(registry, "wakeful_pool_live_sandboxes") == 2
        assert sample(registry, "wakeful_pool_leased") == lease.size == 1
        assert sample(registry, "wakeful_pool_overflow_leases") == 0
        assert sample(registry, "wakeful_pool_waiters") == 0
        activator.release(lease.lease_id)
        assert sample(registry, "wakeful_pool_leased") == 0
    assert b"wakeful_pool_waiters{" in generate_latest(registry)


async def test_requests_waiting_for_a_wake_are_counted_until_it_serves(store: Store) -> None:
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    registry = CollectorRegistry()
    registry.register(PoolCollector(activator.snapshot))
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(), anyio.create_task_group() as requests:
        for _ in range(3):
            requests.start_soon(acquire)
        await eventually(lambda: sample(registry, "wakeful_pool_waiters") == 3)
        assert sample(registry, "wakeful_pool_ready_sandboxes") == 0
        await set_status(store, "sb-1", SandboxStatus.RUNNING)
        await eventually(lambda: len(leases) == 3)
        assert sample(registry, "wakeful_pool_waiters") == 0
        assert sample(registry, "wakeful_pool_leased") == 3


def test_no_pool_no_series() -> None:
    registry = CollectorRegistry()
    registry.register(PoolCollector(list))
    exposed = generate_latest(registry).decode()
    assert "# TYPE wakeful_pool_desired_instances gauge" in exposed  # declared all the same
    assert registry.get_sample_value("wakeful_pool_desired_instances", POOL) is None
