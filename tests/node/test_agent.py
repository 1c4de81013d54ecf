"""The node agent with real processes: boot, probe, exit detection, stop.

No test sleeps and then asserts: each waits for the store to say so (`status_of` follows a
watch), for the agent to let go of a sandbox (`wait_finished`), or drives the agent's clock.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.node import agent_settings, place, put_hello, status_of
from wakeful.aio.packing import pack
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.models import (
    AppSpec,
    Cordon,
    HealthCheck,
    Node,
    Pool,
    Sandbox,
    SandboxStatus,
    SeenNode,
    Version,
)
from wakeful.node.agent import NodeAgent
from wakeful.node.secrets import SecretsRefused
from wakeful.node.settings import NodeSettings
from wakeful.node.testing import FakeSecrets, process_states
from wakeful.store import Event, Store, open_store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"
MACHINE = [1 << 50, 1 << 49]
"""The memory the `node` fixture's agent sees: total and available bytes."""


async def let_go(agent: NodeAgent, sandbox_id: str) -> None:
    """Until the agent runs nothing for the sandbox any more."""
    with anyio.fail_after(20):
        await agent.wait_finished(sandbox_id)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Store, NodeAgent]]:
    async with open_store("memory://") as store:
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        digest = await artifacts.put(pack(HELLO))
        for name, command in [
            ("hello", [sys.executable, "app.py"]),
            (
                "crash",
                [sys.executable, "-c", "import sys; print('boom: missing config'); sys.exit(3)"],
            ),
            (
                "chatty",
                [
                    sys.executable,
                    "-c",
                    "print('x' * 200_000, flush=True); import runpy; "
                    "runpy.run_path('app.py', run_name='__main__')",
                ],
            ),
        ]:
            spec = AppSpec(
                command=command, health=HealthCheck(path="/healthz", timeout=10), shutdown_timeout=5
            )
            await store.put(
                keys.version(name, "v1"),
                Version(app=name, version="v1", spec=spec, artifact=digest),
            )
            await store.put(
                keys.pool(f"{name}-v1"),
                Pool(name=f"{name}-v1", app=name, version="v1", spec=spec, desired_instances=1),
            )
        settings = agent_settings(tmp_path, node_ttl=2)
        MACHINE[:] = [1 << 50, 1 << 49]
        agent = NodeAgent(
            store,
            settings,
            artifacts,
            StateKeeper(store, artifacts).for_node(settings.node_name),
            FakeSecrets(),
            memory=lambda: (MACHINE[0], MACHINE[1]),
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            await agent.wait_registered()
            yield store, agent
            tasks.cancel_scope.cancel()


async def test_a_placed_sandbox_boots_serves_and_is_registered(
    node: tuple[Store, NodeAgent],
) -> None:
    store, _ = node
    assert await store.get(keys.node("n1"), Node) is not None
    await place(store, "sb-1", "hello-v1")
    sandbox = await status_of(store, "sb-1", SandboxStatus.RUNNING)
    assert sandbox.ready and sandbox.address
    # When it became ready (the idle monitor counts idleness from it at the earliest).
    assert sandbox.ready_at >= sandbox.created_at and abs(sandbox.ready_at - time.time()) < 60
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://{sandbox.address}/")
    assert answer.text.startswith("hello from")


async def test_an_exit_is_recorded_at_once_with_code_and_log(node: tuple[Store, NodeAgent]) -> None:
    store, agent = node
    await place(store, "sb-1", "hello-v1")
    sandbox = await status_of(store, "sb-1", SandboxStatus.RUNNING)
    async with httpx.AsyncClient() as client:
        pid = int((await client.get(f"http://{sandbox.address}/")).text.split()[2])
    os.kill(pid, signal.SIGKILL)
    dead = await status_of(store, "sb-1", SandboxStatus.DEAD)
    assert dead.exit_code == -signal.SIGKILL
    assert "hello listening" in dead.last_log
    assert not dead.ready
    await let_go(agent, "sb-1")
    assert agent.running_ids() == []


async def test_a_crash_at_boot_is_dead_with_its_log(node: tuple[Store, NodeAgent]) -> None:
    store, _ = node
    await place(store, "sb-2", "crash-v1")
    dead = await status_of(store, "sb-2", SandboxStatus.DEAD)
    assert dead.exit_code == 3
    assert "boom: missing config" in dead.last_log
    assert dead.address is None


async def test_stopping_a_sandbox_ends_its_process(node: tuple[Store, NodeAgent]) -> None:
    store, agent = node
    await place(store, "sb-1", "hello-v1")
    sandbox = await status_of(store, "sb-1", SandboxStatus.RUNNING)
    item = await store.get(keys.sandbox("sb-1"), Sandbox)
    assert item is not None
    await store.update(
        item.key, sandbox.model_copy(update={"status": SandboxStatus.STOPPING}), item.revision
    )
    stopped = await status_of(store, "sb-1", SandboxStatus.STOPPED)
    assert stopped.exit_code == 0  # SIGTERM handled: a clean exit
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as client:
            await client.get(f"http://{sandbox.address}/")
    await let_go(agent, "sb-1")
    assert agent.running_ids() == []


async def test_a_sandbox_stopped_before_it_started_is_stopped_not_stuck(
    node: tuple[Store, NodeAgent],
) -> None:
    """A pool retired just after it placed a sandbox (a traffic change, issue 39): the record
    reaches the agent already `stopping`, with no process anywhere. Nothing else would ever
    end it: the agent marks it stopped (it once stayed `stopping` for good)."""
    store, agent = node
    never = Sandbox(
        id="sb-9",
        pool="hello-v1",
        app="hello",
        node="n1",
        owner="n1",
        epoch=1,
        status=SandboxStatus.STOPPING,
    )
    await store.create(keys.sandbox("sb-9"), never)
    stopped = await status_of(store, "sb-9", SandboxStatus.STOPPED)
    assert stopped.last_log == "stopped before it started" and stopped.exit_code is None
    await let_go(agent, "sb-9")


class StoppedWhileAsked:
    """Secrets that a stop overtakes: the record goes `stopping` while they are asked for,
    and the control plane refuses a sandbox that is no longer starting."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        item = await self._store.get(keys.sandbox(sandbox_id), Sandbox)
        assert item is not None
        stopping = item.value.model_copy(update={"status": SandboxStatus.STOPPING})
        await self._store.update(item.key, stopping, item.revision)
        raise SecretsRefused(f"sandbox {sandbox_id} is not starting")


async def test_a_stop_that_overtakes_a_start_is_no_boot_crash(
    node: tuple[Store, NodeAgent],
) -> None:
    """Its secrets refused because it was stopped meanwhile: `stopped`, not `dead` (a dead
    one counts as a boot crash, and three made its app answer 503 'failed to boot')."""
    store, agent = node
    agent._services = dataclasses.replace(agent._services, secrets=StoppedWhileAsked(store))
    await place(store, "sb-8", "hello-v1")
    stopped = await status_of(store, "sb-8", SandboxStatus.STOPPED)
    assert stopped.last_log.startswith("stopped before it started (could not fetch")
    await let_go(agent, "sb-8")


async def test_a_very_long_output_line_neither_breaks_the_log_nor_the_sandbox(
    node: tuple[Store, NodeAgent], tmp_path: Path
) -> None:
    store, agent = node
    await place(store, "sb-3", "chatty-v1")
    sandbox = await status_of(store, "sb-3", SandboxStatus.RUNNING)
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"http://{sandbox.address}/")).status_code == 200
    log = (tmp_path / "sandboxes" / "sb-3" / "output.log").read_text()
    assert "x" * 200_000 in log
    assert agent.running_ids() == ["sb-3"]


async def test_a_stopping_agent_drains_stops_and_reports_its_sandboxes(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        digest = await artifacts.put(pack(HELLO))
        spec = AppSpec(command=[sys.executable, "app.py"], health=HealthCheck(path="/healthz"))
        await put_hello(store, spec, digest)
        settings = agent_settings(tmp_path, node_ttl=30, shutdown_drain=0.2)
        agent = NodeAgent(
            store,
            settings,
            artifacts,
            StateKeeper(store, artifacts).for_node(settings.node_name),
            FakeSecrets(),
        )
        seen: list[str] = []
        reported = anyio.Event()
        async with anyio.create_task_group() as observers:

            async def record(after: int) -> None:
                """Every write since `after`, replayed from the store's history."""
                async for event in store.watch("", after + 1):
                    assert isinstance(event, Event)
                    if event.key.startswith(keys.SANDBOXES):
                        status = event.decode(Sandbox).status
                        seen.append(status.value)
                        if status is SandboxStatus.STOPPED:
                            reported.set()
                    elif event.key == keys.cordon("n1") and event.kind == "put":
                        seen.append("cordoned")

            async with anyio.create_task_group() as agent_tasks:
                agent_tasks.start_soon(agent.run)
                await agent.wait_registered()
                await place(store, "sb-1", "hello-v1")
                running = await status_of(store, "sb-1", SandboxStatus.RUNNING)
                listing = await store.list(keys.SANDBOXES, Sandbox)
                observers.start_soon(record, listing.revision)
                agent_tasks.cancel_scope.cancel()  # the agent stops
            with anyio.fail_after(10):
                await reported.wait()
            observers.cancel_scope.cancel()
        final = await store.get(keys.sandbox("sb-1"), Sandbox)
        assert final is not None and final.value.status is SandboxStatus.STOPPED
        # The node is cordoned first: nothing new is placed on it while its sandboxes drain.
        assert seen == ["cordoned", "draining", "stopping", "stopped"]
        assert await store.get(keys.node("n1"), Node) is None  # left at once, not after 30 s
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient() as client:
                await client.get(f"http://{running.address}/")


async def test_after_ownership_is_released_the_old_owner_cannot_write(
    node: tuple[Store, NodeAgent],
) -> None:
    store, agent = node
    await place(store, "sb-1", "hello-v1")
    running = await status_of(store, "sb-1", SandboxStatus.RUNNING)
    item = await store.get(keys.sandbox("sb-1"), Sandbox)
    assert item is not None
    # Ownership moves away (a hand-off in progress) while the record still reads running.
    released = await store.update(
        item.key, running.model_copy(update={"owner": None, "epoch": 2}), item.revision
    )
    async with httpx.AsyncClient() as client:
        pid = int((await client.get(f"http://{running.address}/")).text.split()[2])
    os.kill(pid, signal.SIGKILL)  # the old owner now wants to write "dead"
    await let_go(agent, "sb-1")  # it noticed the exit and tried to report it
    after = await store.get(keys.sandbox("sb-1"), Sandbox)
    assert after is not None
    assert after.revision == released  # refused: nothing was written
    assert (after.value.status, after.value.owner, after.value.epoch) == (
        SandboxStatus.RUNNING,
        None,
        2,
    )


async def test_an_unowned_record_placed_here_is_adopted_and_run(
    node: tuple[Store, NodeAgent],
) -> None:
    store, _ = node
    legacy = Sandbox(id="sb-9", pool="hello-v1", app="hello", node="n1")  # epoch 0, no owner
    await store.create(keys.sandbox("sb-9"), legacy)
    running = await status_of(store, "sb-9", SandboxStatus.RUNNING)
    assert (running.owner, running.epoch) == ("n1", 1)


async def run_agent_once(
    store: Store, settings: NodeSettings, artifacts: LocalArtifacts, clock: ManualClock
) -> None:
    """Start an agent, wait until it serves, move the clock a minute, stop it."""
    async with anyio.create_task_group() as tasks:
        agent = NodeAgent(
            store,
            settings,
            artifacts,
            StateKeeper(store, artifacts).for_node(settings.node_name),
            FakeSecrets(),
            clock=clock,
        )
        tasks.start_soon(agent.run)
        with anyio.fail_after(20):
            await agent.wait_registered()
        clock.advance(60)
        tasks.cancel_scope.cancel()


async def test_a_stopping_agent_cordons_its_node_and_lifts_it_when_back(tmp_path: Path) -> None:
    clock = ManualClock(start=1_000)
    async with open_store("memory://") as store:
        settings = agent_settings(tmp_path, shutdown_drain=0)
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        await store.put(keys.cordon("n2"), Cordon(node="n2"))  # an operator's, elsewhere
        await run_agent_once(store, settings, artifacts, clock)
        cordon = await store.get(keys.cordon("n1"), Cordon)
        assert cordon is not None and cordon.value.by_agent and not cordon.value.evacuate
        assert cordon.value.since == 1_060  # stamped when the agent stopped
        async with anyio.create_task_group() as tasks:
            agent = NodeAgent(
                store,
                settings,
                artifacts,
                StateKeeper(store, artifacts).for_node(settings.node_name),
                FakeSecrets(),
                clock=clock,
            )
            tasks.start_soon(agent.run)
            await agent.wait_registered()
            assert await store.get(keys.cordon("n1"), Cordon) is None
            assert await store.get(keys.cordon("n2"), Cordon) is not None
            tasks.cancel_scope.cancel()


async def test_an_operators_cordon_on_the_node_outlives_the_agents_restart(
    tmp_path: Path,
) -> None:
    clock = ManualClock(start=1_000)
    async with open_store("memory://") as store:
        settings = agent_settings(tmp_path, shutdown_drain=0)
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        theirs = Cordon(node="n1", evacuate=True, since=500)  # `wakeful drain n1 --evacuate`
        await store.put(keys.cordon("n1"), theirs)
        await run_agent_once(store, settings, artifacts, clock)  # stops: finds it, keeps it
        await run_agent_once(store, settings, artifacts, clock)  # starts: not its to lift
        cordon = await store.get(keys.cordon("n1"), Cordon)
        assert cordon is not None and cordon.value == theirs


async def test_a_node_is_seen_from_its_first_registration_on(tmp_path: Path) -> None:
    clock = ManualClock(start=1_000)
    async with open_store("memory://") as store:
        settings = agent_settings(tmp_path, shutdown_drain=0)
        artifacts = LocalArtifacts(tmp_path / "artifacts")
        await run_agent_once(store, settings, artifacts, clock)
        await run_agent_once(store, settings, artifacts, clock)  # a minute later, again
        seen = await store.get(keys.seen("n1"), SeenNode)
        assert seen is not None and seen.value.first_seen == 1_000


async def set_status(store: Store, sandbox_id: str, status: SandboxStatus) -> None:
    """What the activator writes to suspend or thaw a sandbox (and the controller to stop)."""
    item = await store.get(keys.sandbox(sandbox_id), Sandbox)
    assert item is not None
    await store.update(item.key, item.value.model_copy(update={"status": status}), item.revision)


async def frozen(pid: int, want: bool) -> None:
    with anyio.fail_after(20):
        while (process_states([pid]) == {"T"}) != want:  # noqa: ASYNC110 (another process: no event to wait on)
            await anyio.sleep(0.01)


async def test_a_suspended_sandbox_is_frozen_answers_once_thawed_and_is_named_for_memory(
    node: tuple[Store, NodeAgent],
) -> None:
    """The record says `suspended`: every process stops where it is; a request sent then is
    answered once the record says `running` again. Past the node's cap for suspended memory,
    the longest suspended is named in the node record; a frozen sandbox still stops cleanly."""
    store, agent = node
    machine = MACHINE
    pids = {}
    for sandbox_id in ("sb-1", "sb-2"):
        await place(store, sandbox_id, "hello-v1")
        sandbox = await status_of(store, sandbox_id, SandboxStatus.RUNNING)
        async with httpx.AsyncClient() as client:
            pids[sandbox_id] = int((await client.get(f"http://{sandbox.address}/")).text.split()[2])
        await set_status(store, sandbox_id, SandboxStatus.SUSPENDED)
        await frozen(pids[sandbox_id], True)
    address = (await status_of(store, "sb-1", SandboxStatus.SUSPENDED)).address
    answers: list[httpx.Response] = []

    async def ask() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            answers.append(await client.get(f"http://{address}/"))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(ask)
        await anyio.sleep(0.2)
        assert answers == []  # sent, and held in the frozen app's backlog
        await set_status(store, "sb-1", SandboxStatus.RUNNING)
    assert answers[0].status_code == 200
    await frozen(pids["sb-1"], False)

    await set_status(store, "sb-1", SandboxStatus.SUSPENDED)
    await frozen(pids["sb-1"], True)
    with anyio.fail_after(20):  # frozen, then measured: counted once both are done
        while True:
            assert await agent.check_suspended() == (0, [])  # the machine: plenty
            record = await store.get(keys.node("n1"), Node)
            assert record is not None
            if record.value.suspended == 2:
                break
            await anyio.sleep(0.01)
    held = record.value.suspended_memory
    assert held > 2 << 20  # two Python processes
    # A cap (25% of the machine, by default) that holds less than the two: what is over it is
    # asked for, and both are listed, the longest suspended first (sb-2 now: sb-1 was thawed
    # and frozen again; the activator may have to pass over sb-2).
    machine[:] = [held * 3, held * 3]
    wanted, order = await agent.check_suspended()
    assert order == ["sb-2", "sb-1"]
    record = await store.get(keys.node("n1"), Node)
    assert record is not None and [e.sandbox for e in record.value.evict] == order
    sizes = {e.sandbox: e.memory for e in record.value.evict}
    assert sum(sizes.values()) == held
    assert wanted == record.value.evict_bytes == held - record.value.suspended_memory_cap > 0
    machine[:] = [held * 100, held]  # under the cap, but less than 5% available: pressure
    assert await agent.check_suspended() == (1, ["sb-2", "sb-1"])  # at least one, each pass
    record = await store.get(keys.node("n1"), Node)
    assert record is not None and record.value.memory_pressure

    await set_status(store, "sb-2", SandboxStatus.STOPPING)
    stopped = await status_of(store, "sb-2", SandboxStatus.STOPPED)
    assert stopped.exit_code == 0  # thawed first, so its SIGTERM handler ran
    await let_go(agent, "sb-2")
