from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
from prometheus_client import CollectorRegistry

from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.store import Item, Store

POOL_KEY = keys.pool("hello-v1")


def make_activator(
    store: Store,
    clock: Callable[[], float] | None = None,
    wall_clock: Callable[[], float] | None = None,
    **settings: object,
) -> Activator:
    """`clock` times leases and waiters (monotonic); `wall_clock` stamps shared records."""
    config = ActivatorSettings(store_url="memory://", token="t", **settings)  # type: ignore[arg-type]
    clocks: dict[str, Callable[[], float]] = {}
    if clock is not None:
        clocks["clock"] = clock
    if wall_clock is not None:
        clocks["wall_clock"] = wall_clock
    return Activator(store, config, CollectorRegistry(), **clocks)


async def seed(
    store: Store,
    *,
    rpi: int = 5,
    desired: int = 1,
    max_instances: int = 20,
    activation_timeout: float = 120,
    sandboxes: dict[str, SandboxStatus] | None = None,
    hard_limit: int | None = None,
) -> None:
    spec = AppSpec(
        command=["serve"],
        concurrency=Concurrency(
            requests_per_instance=rpi, max_instances=max_instances, hard_limit=hard_limit
        ),
        activation_timeout=activation_timeout,
    )
    await store.put(keys.app("hello"), App(name="hello", active_version="v1"))
    await store.put(
        POOL_KEY,
        Pool(name="hello-v1", app="hello", version="v1", spec=spec, desired_instances=desired),
    )
    for index, (sandbox_id, status) in enumerate((sandboxes or {}).items()):
        await store.put(keys.sandbox(sandbox_id), sandbox(sandbox_id, status, 9000 + index))


def sandbox(sandbox_id: str, status: SandboxStatus, port: int = 9000) -> Sandbox:
    running = status is SandboxStatus.RUNNING
    return Sandbox(
        id=sandbox_id,
        pool="hello-v1",
        app="hello",
        node="n1",
        status=status,
        ready=running,
        address=f"127.0.0.1:{port}" if running else None,
    )


async def set_status(store: Store, sandbox_id: str, status: SandboxStatus, port: int = 9000) -> int:
    return await store.put(keys.sandbox(sandbox_id), sandbox(sandbox_id, status, port))


async def pool(store: Store) -> Item[Pool]:
    found = await store.get(POOL_KEY, Pool)
    assert found is not None
    return found


async def settle(rounds: int = 10) -> None:
    """Let every task that can run take its steps (a woken waiter runs to its next await)."""
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until `check()` holds, yielding to the loop in between."""
    with anyio.fail_after(within):
        for _ in range(10_000_000):
            if check():
                return
            await anyio.sleep(0.005)
