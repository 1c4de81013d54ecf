from __future__ import annotations

from collections.abc import Callable

import anyio
from prometheus_client import CollectorRegistry

from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.store import Item, Store

POOL_KEY = "pools/hello-v1"


def make_activator(
    store: Store, clock: Callable[[], float] | None = None, **settings: object
) -> Activator:
    config = ActivatorSettings(store_url="memory://", token="t", **settings)  # type: ignore[arg-type]
    if clock is None:
        return Activator(store, config, CollectorRegistry())
    return Activator(store, config, CollectorRegistry(), clock=clock)


async def seed(
    store: Store,
    *,
    rpi: int = 5,
    desired: int = 1,
    max_instances: int = 20,
    activation_timeout: float = 120,
    sandboxes: dict[str, SandboxStatus] | None = None,
) -> None:
    spec = AppSpec(
        command=["serve"],
        concurrency=Concurrency(requests_per_instance=rpi, max_instances=max_instances),
        activation_timeout=activation_timeout,
    )
    await store.put("apps/hello", App(name="hello", active_version="v1"))
    await store.put(
        POOL_KEY,
        Pool(name="hello-v1", app="hello", version="v1", spec=spec, desired_instances=desired),
    )
    for index, (sandbox_id, status) in enumerate((sandboxes or {}).items()):
        await store.put(f"sandboxes/{sandbox_id}", sandbox(sandbox_id, status, 9000 + index))


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
    return await store.put(f"sandboxes/{sandbox_id}", sandbox(sandbox_id, status, port))


async def pool(store: Store) -> Item[Pool]:
    found = await store.get(POOL_KEY, Pool)
    assert found is not None
    return found


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until `check()` holds, yielding to the loop in between."""
    with anyio.fail_after(within):
        for _ in range(10_000_000):
            if check():
                return
            await anyio.sleep(0.005)
