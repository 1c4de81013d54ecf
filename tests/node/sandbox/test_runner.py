"""How one sandbox's life ends, as its runner records it, on the fake runtime the package ships:
the status, exit code and last log for each way a sandbox can fail or be stopped."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
import httpx
import pytest

from wakeful.domain import keys
from wakeful.domain.models import AppSpec, AppState, HealthCheck, Pool, Sandbox, Version
from wakeful.domain.models import SandboxStatus as S
from wakeful.node.agent import NodeAgent
from wakeful.node.sandbox.ports import PortPool
from wakeful.node.sandbox.runner import NodeServices, SandboxRunner
from wakeful.node.secrets import SecretsRefused
from wakeful.node.settings import NodeSettings
from wakeful.node.state.hold import StateHold
from wakeful.node.testing import FakeProgram, FakeRuntime, FakeSecrets
from wakeful.node.writer import SandboxWriter
from wakeful.store import Event, Item, Store, open_store

pytestmark = pytest.mark.anyio
SERVES = FakeProgram(output=b"web listening\n", serve_http=True)


@dataclass(frozen=True)
class Case:
    program: FakeProgram | None
    """What the command `web` does; None: there is no such program, the start fails."""
    then: Literal["wait", "crash", "stop"] = "wait"
    """Once it runs: wait for it to end, make it crash (exit 137), or stop it as the pool
    controller does."""
    status: S = S.DEAD
    exit_code: int | None = None
    last_log: str = ""
    terminated: bool = False
    """The agent sent its process a SIGTERM (it had one, and it had not exited already)."""
    health_timeout: float = 10
    fixed_port_taken: bool = False
    pool: str = "web-v1"
    secrets_fail: Exception | None = None
    """What the node's `SecretSource` raises (None: it answers)."""
    started: bool = True
    """The runtime was asked to start it."""


class NoArtifacts:
    async def fetch(self, digest: str) -> bytes:
        raise AssertionError("these versions have no artifact")


class NoKeeper:
    """These apps have no state: nothing is ever handed back."""

    async def store(self, app: str, epoch: int, data: bytes, digest: str) -> None:
        raise AssertionError("these apps have no state")

    async def release(self, app: str, epoch: int, **kwargs: object) -> AppState | None:
        raise AssertionError("these apps have no state")

    async def keep(self, app: str, epoch: int, error: str, **kwargs: object) -> AppState | None:
        raise AssertionError("these apps have no state")


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@contextlib.asynccontextmanager
async def node_running(
    tmp_path: Path, case: Case, taken_port: int
) -> AsyncIterator[tuple[Store, NodeAgent, FakeRuntime]]:
    spec = AppSpec(
        command=["web"],
        health=HealthCheck(path="/healthz", timeout=case.health_timeout),
        port=taken_port if case.fixed_port_taken else None,
        shutdown_timeout=1,
    )
    settings = NodeSettings(store_url="memory://", node_name="n1", data_dir=tmp_path)
    programs = {} if case.program is None else {"web": case.program}
    async with open_store("memory://") as store, FakeRuntime(programs) as runtime:
        await store.put(keys.version("web", "v1"), Version(app="web", version="v1", spec=spec))
        await store.put(
            keys.pool("web-v1"), Pool(name="web-v1", app="web", version="v1", spec=spec)
        )
        secrets = FakeSecrets({"API_KEY": "k"})
        secrets.failure = case.secrets_fail
        agent = NodeAgent(store, settings, NoArtifacts(), NoKeeper(), secrets, runtime=runtime)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            await agent.wait_registered()
            yield store, agent, runtime
            tasks.cancel_scope.cancel()


async def first_write(store: Store, after: int, *wanted: S) -> Sandbox:
    """The first write of sb-1 at one of `wanted` after revision `after`."""
    changes = store.watch(keys.sandbox("sb-1"), after + 1)
    try:
        async for change in changes:
            assert isinstance(change, Event) and change.kind == "put"
            sandbox = change.decode(Sandbox)
            if sandbox.status in wanted:
                return sandbox
    finally:
        await changes.aclose()  # type: ignore[attr-defined]
    raise AssertionError("the watch ended")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            Case(None, last_log="could not start: [Errno 2] no such program: 'web'", started=False),
            id="a start that fails is dead, saying why",
        ),
        pytest.param(
            Case(
                FakeProgram(b"boom: missing config\n", exit_code=3),
                exit_code=3,
                last_log="boom: missing config",
            ),
            id="an exit before ready is dead with its code and its last output",
        ),
        pytest.param(
            Case(
                FakeProgram(),
                exit_code=0,
                last_log="not ready on port {own_port} within 0.2 s",
                terminated=True,
                health_timeout=0.2,
            ),
            id="silent and never ready: stopped, and dead naming the health timeout",
        ),
        pytest.param(
            Case(SERVES, then="crash", exit_code=137, last_log="web listening"),
            id="a crash while running is dead with its code and its last output",
        ),
        pytest.param(
            Case(
                FakeProgram(serve_http=True, on_terminate=7),
                then="stop",
                status=S.STOPPED,
                exit_code=7,
                terminated=True,
            ),
            id="a stop request ends it stopped, with the code it exited with",
        ),
        pytest.param(
            Case(SERVES, last_log="its pool no longer exists", pool="gone-v1", started=False),
            id="a sandbox whose pool is gone is dead, saying so",
        ),
        pytest.param(
            Case(
                SERVES,
                last_log="port {port} is already in use",
                fixed_port_taken=True,
                started=False,
            ),
            id="a fixed port that is taken: dead, naming the port",
        ),
        pytest.param(
            Case(
                SERVES,
                last_log="could not fetch its secrets: control API away",
                secrets_fail=OSError("control API away"),
                started=False,
            ),
            id="secrets that cannot be fetched now: dead, never started without them",
        ),
        pytest.param(
            Case(
                SERVES,
                last_log="could not fetch its secrets: not this node's",
                secrets_fail=SecretsRefused("not this node's"),
                started=False,
            ),
            id="secrets refused: dead, never started without them",
        ),
    ],
)
async def test_how_a_sandbox_ends_is_recorded(case: Case, tmp_path: Path, taken_port: int) -> None:
    async with node_running(tmp_path, case, taken_port) as (store, agent, runtime):
        placed = Sandbox(id="sb-1", pool=case.pool, app="web", node="n1", owner="n1", epoch=1)
        revision = await store.create(keys.sandbox("sb-1"), placed)
        with anyio.fail_after(20):
            if case.then != "wait":
                running = await first_write(store, revision, S.RUNNING)
                async with httpx.AsyncClient() as client:  # it serves where it was recorded
                    answer = await client.get(f"http://{running.address}/")
                assert answer.text == f"fake {runtime.started[0].pid}"
                if case.then == "crash":
                    runtime.started[0].exit(137)
                else:
                    item = await store.get(keys.sandbox("sb-1"), Sandbox)
                    assert item is not None
                    stopping = item.value.model_copy(update={"status": S.STOPPING})
                    await store.update(item.key, stopping, item.revision)
            ended = await first_write(store, revision, S.DEAD, S.STOPPED)
            await agent.wait_finished("sb-1")
    assert ended.status is case.status
    assert ended.exit_code == case.exit_code
    own = runtime.started[0].env["PORT"] if runtime.started else ""
    assert ended.last_log == case.last_log.format(port=taken_port, own_port=own)
    assert not ended.ready
    assert agent.running_ids() == []
    assert any(process.terminated for process in runtime.started) is case.terminated
    assert bool(runtime.started) is case.started


async def test_a_sandbox_starts_with_its_secrets_asked_for_once_below_port_and_host(
    tmp_path: Path,
) -> None:
    """The runtime gets the manifest's env, the app's secrets, then PORT and HOST (a secret
    never overrides them), and the command with `$PORT`/`${HOST}` replaced; the source is
    asked once, at the start, for that sandbox."""
    command = ["web", "--bind", "${HOST}:$PORT"]
    spec = AppSpec(command=command, env={"MODE": "plain"}, health=HealthCheck(path="/healthz"))
    settings = NodeSettings(store_url="memory://", node_name="n1", data_dir=tmp_path)
    secrets = FakeSecrets({"API_KEY": "k3y", "PORT": "1", "HOST": "0.0.0.0"})

    async def before_shutdown() -> None:
        pass

    async with open_store("memory://") as store, FakeRuntime({"web": SERVES}) as runtime:
        await store.put(keys.version("web", "v1"), Version(app="web", version="v1", spec=spec))
        await store.put(
            keys.pool("web-v1"), Pool(name="web-v1", app="web", version="v1", spec=spec)
        )
        placed = Sandbox(id="sb-1", pool="web-v1", app="web", node="n1", owner="n1", epoch=1)
        revision = await store.create(keys.sandbox("sb-1"), placed)
        services = node_services(store, settings, runtime, before_shutdown, secrets)
        runner = SandboxRunner("sb-1", services)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(runner.run)
            with anyio.fail_after(20):
                running = await first_write(store, revision, S.RUNNING)
            runner.stop()
    env = runtime.started[0].env
    host, port = running.address.rsplit(":", 1) if running.address else ("", "")
    assert (env["PORT"], env["HOST"]) == (port, host) == (port, "127.0.0.1")
    assert (env["API_KEY"], env["MODE"]) == ("k3y", "plain")
    assert list(runtime.started[0].command) == ["web", "--bind", f"{host}:{port}"]  # expanded
    assert secrets.asked == ["sb-1"]
    assert "k3y" not in running.model_dump_json()


async def test_a_sandbox_that_loses_its_record_to_the_store_stops_without_cordoning_the_node(
    tmp_path: Path,
) -> None:
    """Only an agent that stops cordons its node. A sandbox whose record can no longer be
    written (the store went away while it booted) is stopped on its own, and the node stays
    open for new sandboxes."""

    spec = AppSpec(command=["web"], health=HealthCheck(path="/healthz", timeout=60))
    settings = NodeSettings(
        store_url="memory://", node_name="n1", data_dir=tmp_path, shutdown_drain=0
    )
    cordons: list[str] = []

    async def before_shutdown() -> None:
        cordons.append("cordoned")

    booted = anyio.Event()
    slow = FakeProgram(output=b"starting\n", serve_http=True, answer_after=booted)
    async with open_store("memory://") as store, FakeRuntime({"web": slow}) as runtime:
        await store.put(keys.version("web", "v1"), Version(app="web", version="v1", spec=spec))
        await store.put(
            keys.pool("web-v1"), Pool(name="web-v1", app="web", version="v1", spec=spec)
        )
        await store.put(
            keys.sandbox("sb-1"),
            Sandbox(id="sb-1", pool="web-v1", app="web", node="n1", owner="n1", epoch=1),
        )
        runner = SandboxRunner("sb-1", node_services(store, settings, runtime, before_shutdown))
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(runner.run)
            with anyio.fail_after(30):
                while True:
                    found = await store.get(keys.sandbox("sb-1"), Sandbox)
                    if found is not None and found.value.status is S.BOOTING:
                        break
                    await anyio.sleep(0.01)
            await store.aclose()  # its "ready" cannot be written now
            booted.set()
            with anyio.fail_after(30):
                await runner.finished.wait()
        assert [p.terminated for p in runtime.started] == [True]
        assert cordons == []


async def test_a_record_that_moved_after_the_watch_saw_it_is_not_started(tmp_path: Path) -> None:
    """The runner claims the record as the agent's watch delivered it, without reading it
    again: one placed elsewhere since (the watch has not said so yet) gets no process here."""

    spec = AppSpec(command=["web"], health=HealthCheck(path="/healthz", timeout=10))
    settings = NodeSettings(store_url="memory://", node_name="n1", data_dir=tmp_path)

    async def before_shutdown() -> None:
        pass

    async with open_store("memory://") as store, FakeRuntime({"web": SERVES}) as runtime:
        await store.put(keys.version("web", "v1"), Version(app="web", version="v1", spec=spec))
        await store.put(
            keys.pool("web-v1"), Pool(name="web-v1", app="web", version="v1", spec=spec)
        )
        placed = Sandbox(id="sb-1", pool="web-v1", app="web", node="n1", owner="n1", epoch=1)
        revision = await store.create(keys.sandbox("sb-1"), placed)
        seen = Item(keys.sandbox("sb-1"), placed, revision)
        moved = placed.model_copy(update={"node": "n2", "owner": "n2", "epoch": 2})
        await store.update(keys.sandbox("sb-1"), moved, revision)
        services = node_services(store, settings, runtime, before_shutdown)
        with anyio.fail_after(30):
            await SandboxRunner("sb-1", services, seen).run()
        now = await store.get(keys.sandbox("sb-1"), Sandbox)
    assert runtime.started == []
    assert now is not None and now.value == moved


def node_services(
    store: Store,
    settings: NodeSettings,
    runtime: FakeRuntime,
    before_shutdown: Callable[[], Awaitable[None]],
    secrets: FakeSecrets | None = None,
) -> NodeServices:
    """What a runner of node n1 shares, on the fake runtime, with no artifacts and no shipper
    (and no secrets unless given)."""
    return NodeServices(
        store=store,
        settings=settings,
        artifacts=NoArtifacts(),
        runtime=runtime,
        ports=PortPool(*settings.port_range, host=settings.node_address),
        writer=SandboxWriter(store, "n1"),
        shipper=None,
        before_shutdown=before_shutdown,
        states=StateHold(store, NoArtifacts(), NoKeeper(), "n1", settings.data_dir, 1 << 20),
        secrets=secrets or FakeSecrets(),
    )
