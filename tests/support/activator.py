"""An activator on a store for a test, and the sample app's records (app, pool, sandboxes) as
the activator reads them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import anyio.lowlevel
import uvicorn
import websockets.asyncio.client
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from tests.support.waiting import eventually
from wakeful.activator.api import create_app
from wakeful.activator.channel import PATH
from wakeful.activator.client import ChannelLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.aio.marks import Marks
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Role, Sandbox, SandboxStatus
from wakeful.store import Item, Store
from wakeful.store.testing import free_port
from wakeful.store.tokenbook import TokenBook
from wakeful.testing import ManualClock

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


TOKEN = "s3cret-token"


@dataclass(frozen=True)
class Served:
    url: str
    store: Store
    activator: Activator
    clock: ManualClock
    """The activator's clock: waiters time out only when a test moves it."""
    routes_seen: Marks
    """How far the ingresses on its lease channels say their routes have come."""


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """`app` on uvicorn on a free loopback port, its base URL; stopped on the way out."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn exposes a flag, no event
                await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


@contextlib.asynccontextmanager
async def serve_activator(store: Store, adopt_for: float = 0.0) -> AsyncIterator[Served]:
    """An activator on `store` (its clock a ManualClock) with its API on uvicorn."""
    settings = ActivatorSettings(store_url="memory://", token=TOKEN)
    registry = CollectorRegistry()
    clock = ManualClock()
    activator = Activator(store, settings, registry, clock=clock)
    seen = Marks(settle=0)
    async with (
        activator.running(adopt_for=adopt_for),
        serving(create_app(activator, ADMIN, registry, routes_seen=seen)) as url,
    ):
        yield Served(url, store, activator, clock, seen)


async def nothing_routable(api: Served) -> None:
    await set_status(api.store, "sb-1", SandboxStatus.BOOTING)
    await eventually(lambda: api.activator.snapshot()[0].ready == 0)


ADMIN = TokenBook.of({TOKEN: Role.ADMIN})
"""The control API's credentials: TOKEN, as an admin token."""


ACTIVATION_TIMEOUT = 120.0
"""Long enough that only moving the clock (never real time) ends a wait in these tests."""


class Leading:
    """Where `locate` says the leading activator is; `move_to` another, the old channel lost
    (as when the leader dies)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def locate(self) -> str:
        return self.url

    async def move_to(self, url: str, leases: ChannelLeases) -> None:
        self.url = url
        link = leases._link
        assert link is not None
        await link.close()


async def answered_alone(api: Served, frame: list[dict[str, object]]) -> dict[int, object]:
    """`frame` sent raw on a channel of its own: its answers by id, every operation but the
    last refused as not the protocol, the channel still up to answer the last."""
    url = api.url.replace("http", "ws", 1) + PATH
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with websockets.asyncio.client.connect(url, additional_headers=headers) as raw:
        await raw.send(json.dumps(frame))
        answers: dict[int, dict[str, object]] = {}
        with anyio.fail_after(10):
            while len(answers) < len(frame):
                answers |= {a["id"]: a for a in json.loads(await raw.recv())}
    for refused in range(1, len(frame)):
        assert answers[refused]["error"] == "invalid request", answers[refused]
    return dict(answers)
