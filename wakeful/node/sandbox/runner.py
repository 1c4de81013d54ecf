"""One sandbox's life on this node: prepare its directory and port, start it, probe it, serve
until it exits or is stopped, report.

Theory of operation:
- The agent makes one `SandboxRunner` per sandbox placed here in `pending`, runs it in its task
  group, and calls `stop()` when the pool controller moves the sandbox to `stopping` or
  deletes it.
- `run` claims the record as the agent's watch delivered it (read again when there is none):
  it must be pending and this node's to run. The epoch it runs at goes to the `SandboxWriter`,
  which fences every later write on it (invariant 15) and tries the first one (booting) on
  that record's revision: a record that moved since is read again and decided from afresh.
- Preparing takes the pool's spec, fetches the version's artifact and picks a port; the runtime
  unpacks the artifact where the sandbox will see it (its own tmpfs when isolated as root, so
  the files are written once). The app's secrets are asked for then (`wakeful.node.secrets`),
  merged into its environment at the start and not kept past it: they live in `_boot`'s
  frame alone. A failure there, or at start, is recorded dead with a reason a person can act
  on (never a value).
- Started, the process is probed until ready (first probe at once, backing off to ~100 ms),
  then waited on until it exits or a stop is requested. An exit is noticed the moment it
  happens and recorded with its code and last log lines (`outcome.ending` decides how). Output
  goes to `output.log` in the sandbox's directory and, when the node ships logs, to its
  `LogShipper`. While ready, it is frozen and thawed as its record asks (`freezing`).
- A stateful app's state is claimed while preparing, marked restored once the app started on
  it, and handed back once the sandbox is reported ended (`wakeful.node.state.claim`).
- When the agent itself stops (the runner is cancelled with a process alive), the sandbox is
  drained, given `shutdown_drain` seconds, stopped and recorded stopped: shielded, and with
  bounded store writes, so a store that is down does not keep the process running.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain.artifacts import ArtifactError
from wakeful.domain.lifecycle import Transition
from wakeful.domain.models import (
    AppSpec,
    ImageRecord,
    Pool,
    Sandbox,
    SandboxStatus,
    Version,
)
from wakeful.node.fencing import start_epoch
from wakeful.node.images import ImageError
from wakeful.node.logship import LogShipper
from wakeful.node.secrets import SecretSource, SecretsRefused
from wakeful.node.settings import NodeSettings
from wakeful.node.state.claim import StateClaim
from wakeful.node.state.hold import StateHold, StateRefused
from wakeful.node.writer import SandboxWriter
from wakeful.store import Item, Store, StoreError

from .freezing import Freezing
from .launch import Launch, ports, what_runs
from .outcome import ending, last_lines
from .ports import NoFreePort, PortPool
from .probe import wait_ready
from .runtime import Identity, Runtime, SandboxProcess
from .workdir import Artifacts, fetch_packed, remove_sandbox_dir, sandbox_dir

log = logging.getLogger(__name__)
STORE_WRITE_BOUND = 5.0
"""Seconds a shutdown waits for one store write before going on without it."""


@dataclass(frozen=True)
class NodeServices:
    """What every sandbox runner on one node shares."""

    store: Store
    settings: NodeSettings
    artifacts: Artifacts
    runtime: Runtime
    ports: PortPool
    writer: SandboxWriter
    shipper: LogShipper | None
    before_shutdown: Callable[[], Awaitable[None]]
    """Awaited when the agent stops, before a live sandbox is drained (it cordons the node)."""
    states: StateHold
    """Stateful apps' state: restored at start, archived and handed back at the end."""
    secrets: SecretSource
    """Each app's secrets, asked for at its sandbox's start."""


class CannotRun(Exception):
    """The sandbox cannot be prepared or started; the message is its recorded `last_log`."""


class SandboxRunner:
    def __init__(
        self, sandbox_id: str, node: NodeServices, placed: Item[Sandbox] | None = None
    ) -> None:
        """`placed`: the record as the agent's watch delivered it, claimed from without a read
        (a record moved since fails the first write's compare-and-set and is read then)."""
        self.sandbox_id = sandbox_id
        self._node = node
        self._placed = placed
        self._stop_requested = anyio.Event()
        self.finished = anyio.Event()
        """Set as the last step of `run`."""
        self._process: SandboxProcess | None = None
        self._started: SandboxProcess | None = None
        """The process this runner started (kept after it ended: its tree holds the state)."""
        self._state: StateClaim | None = None
        """A stateful app's state this sandbox holds, until handed back."""
        self._port: int | None = None
        """A port taken from the node's pool, given back when the runner ends."""
        self._squatted = False
        self._gave_up = False
        """It was still running, not ready, when its health timeout ran out (not a crash)."""

        app = "" if placed is None else placed.value.app
        self.freezing = Freezing(sandbox_id, app, self._stop_requested)
        """Frozen while its record says `suspended` (the agent's watch tells it)."""

        self.local_target: tuple[str, int] | None = None
        """Where the sandbox answers on this node, while it is ready and not stopping: what
        a tunnel exchange naming it connects to (`wakeful.node.tunnel.client`)."""

    def stop(self) -> None:
        """Stop the sandbox (SIGTERM, then SIGKILL after its shutdown timeout) and report."""
        self._stop_requested.set()

    async def stop_process(self, grace: float) -> None:
        if self._process is not None:
            await self._process.stop(grace)

    async def run(self) -> None:
        agent_stopping = False
        try:
            await self._run()
        except anyio.get_cancelled_exc_class():
            agent_stopping = True  # the agent's task group is being cancelled: it stops
            raise
        except Exception as exc:
            if _all_store_errors(exc):  # from this task or from its supervising task group
                log.error("lost track of sandbox: %s", exc, extra={"sandbox": self.sandbox_id})
            else:
                # One sandbox's failure must not take the agent and every other sandbox down.
                log.exception("sandbox failed", extra={"sandbox": self.sandbox_id})
                with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                    await self._change(Transition.FAIL, last_log="node agent error")
        finally:
            if self._process is not None:
                with anyio.CancelScope(shield=True):
                    await self._shut_down(self._process, agent_stopping=agent_stopping)
            await self._hand_back()  # done already on every path that stopped a process
            if self._started is not None:
                self._started.dispose()
            if self._port is not None:  # only once nothing listens on it any more
                self._node.ports.give_back(self._port)
            self._node.writer.forget(self.sandbox_id)
            if self._node.shipper is not None:
                self._node.shipper.close(self.sandbox_id)
            # Its output was shipped and its record holds the tail: nothing here is needed.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(
                    remove_sandbox_dir, self._node.settings.data_dir, self.sandbox_id
                )
            self.finished.set()

    async def _change(self, event: Transition, **fields: object) -> bool:
        return await self._node.writer.change(self.sandbox_id, event, **fields)

    async def _run(self) -> None:
        record = await self._claim()
        if record is None:
            return
        try:
            booted = await self._boot(record)
        except CannotRun as exc:
            if await self._stopped_before_start(exc):
                return
            await self._change(Transition.FAIL, last_log=str(exc))
            return
        if booted is None:  # its record moved on before the start: stopped, perhaps
            await self._stopped_before_start(None)
            return
        launch, process = booted
        if self._state is not None:
            await self._state.restored(launch.base)
        shipper = self._node.shipper
        forward = (
            _discard
            if shipper is None
            else shipper.open(self.sandbox_id, record.app, record.created_at, launch.version)
        )
        ready, exit_code = await self._supervise(process, launch, forward)
        self._process = None
        await self._report(process, launch, ready, exit_code)
        await self._hand_back()

    async def _hand_back(self) -> None:
        """A stateful app's state, handed back once (`StateClaim.hand_back`): after the sandbox
        is reported ended (it is not routable while this runs); the state, held meanwhile,
        keeps the next sandbox from being placed."""
        claim, self._state = self._state, None
        if claim is not None:
            await claim.hand_back(None if self._started is None else self._started.app_dir)

    async def _stopped_before_start(self, exc: CannotRun | None) -> bool:
        """A stop that came while the sandbox was being prepared (its pool retired, say) is
        why it could not start (its secrets are refused to a sandbox no longer starting):
        it is `stopped`, not `dead`, so that no boot crash is counted against its app."""
        item = await self._node.store.get(keys.sandbox(self.sandbox_id), Sandbox)
        if item is None or item.value.status is not SandboxStatus.STOPPING:
            return False
        why = "stopped before it started" + (f" ({exc})" if exc is not None else "")
        return await self._change(Transition.STOPPED, last_log=why)

    async def _claim(self) -> Sandbox | None:
        """The record, if it is still pending and this node's to run; its epoch is noted. A
        record this node holds that was stopped before it ever started (no process of it
        exists anywhere) is marked stopped here: nothing else would."""
        item, self._placed = self._placed, None
        if item is None:
            item = await self._node.store.get(keys.sandbox(self.sandbox_id), Sandbox)
        if item is not None and item.value.status is SandboxStatus.STOPPING:
            epoch = start_epoch(item.value, self._node.settings.node_name)
            if epoch is not None and item.value.address is None:
                self._node.writer.started(self.sandbox_id, epoch, item)
                await self._change(Transition.STOPPED, last_log="stopped before it started")
            return None
        if item is None or item.value.status is not SandboxStatus.PENDING:
            return None
        epoch = start_epoch(item.value, self._node.settings.node_name)
        if epoch is None:
            log.warning(
                "placed here but owned by %s", item.value.owner, extra={"sandbox": self.sandbox_id}
            )
            return None
        self._node.writer.started(self.sandbox_id, epoch, item)
        trace.mark("claimed", item.value.app)
        return item.value

    async def _boot(self, record: Sandbox) -> tuple[Launch, SandboxProcess] | None:
        """Prepare, ask for the secrets, say booting, start. The secrets are this frame's
        alone: gone once it returns. None: the record moved on before the start."""
        launch = await self._prepare(record)
        try:
            secrets = await self._node.secrets.env_for(self.sandbox_id)
        except (OSError, StoreError, SecretsRefused) as exc:  # their reasons name no value
            raise CannotRun(f"could not fetch its secrets: {exc}") from None
        trace.mark("prepared", record.app)
        if not await self._change(Transition.START):
            return None
        trace.mark("booting", record.app)
        process = self._process = await self._start(launch, secrets)  # `run` stops it now on
        trace.mark("spawned", record.app)
        return launch, process

    async def _prepare(self, record: Sandbox) -> Launch:
        store, settings = self._node.store, self._node.settings
        pool = await store.get(keys.pool(record.pool), Pool)
        if pool is None:
            raise CannotRun("its pool no longer exists")
        spec = pool.value.spec
        version = await store.get(keys.version(pool.value.app, pool.value.version), Version)
        base = sandbox_dir(settings.data_dir, self.sandbox_id)
        layer = None
        if spec.state is not None:
            try:
                self._state, layer = await StateClaim.take(
                    self._node.states, record.app, self.sandbox_id, spec.state.path
                )
            except StateRefused as exc:
                raise CannotRun(str(exc)) from exc
        try:
            packed = await fetch_packed(
                self._node.artifacts, version.value.artifact if version else None, layer
            )
        except (OSError, ArtifactError) as exc:
            raise CannotRun(f"could not fetch its artifact: {exc}") from exc
        if packed is None:  # an app without files: an empty directory to run in
            (base / "app").mkdir(mode=0o700, parents=True, exist_ok=True)
        host = settings.node_address
        image = version.value.image if version else None
        port, app_port = self._pick_port(spec, image)
        return Launch(
            spec=spec,
            app=record.app,
            base=base,
            packed=packed,
            host=host,
            port=port,
            image=image,
            app_port=app_port,
            version=pool.value.version,
        )

    def _pick_port(self, spec: AppSpec, image: ImageRecord | None) -> tuple[int, int | None]:
        """`launch.ports`, with the port taken from the pool noted for its giving back."""
        try:
            port, app_port, self._port = ports(self._node.ports, spec, image)
        except NoFreePort as exc:
            raise CannotRun(str(exc)) from exc
        return port, app_port

    async def _start(self, launch: Launch, secrets: dict[str, str]) -> SandboxProcess:
        try:
            stateful = launch.spec.state is not None
            identity = Identity(self.sandbox_id, launch.app, launch.spec.resources, stateful)
            command, env, image = what_runs(launch, secrets)
            self._started = await self._node.runtime.start(
                command,
                env,
                launch.base / "app",
                launch.base / "output.log",
                identity,
                launch.packed,
                image,
            )
            return self._started
        except ArtifactError as exc:
            raise CannotRun(f"could not unpack: {exc}") from exc
        except ImageError as exc:
            raise CannotRun(f"could not prepare its image: {exc}") from exc
        except OSError as exc:
            raise CannotRun(f"could not start: {exc}") from exc

    async def _supervise(
        self, process: SandboxProcess, launch: Launch, forward: Callable[[bytes], None]
    ) -> tuple[bool, int | None]:
        """Probe until ready, then wait for an exit or a stop request. (ready, exit code)."""
        spec = launch.spec
        exit_code: int | None = None
        ready = False
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(process.pump, forward)

            async def watch_exit() -> None:
                nonlocal exit_code
                exit_code = await process.wait()
                tasks.cancel_scope.cancel()

            tasks.start_soon(watch_exit)
            ready = await wait_ready(
                launch.host,
                launch.port,
                spec.health.path,
                spec.health.timeout,
                process.wait,
                process.listening,
                spec.health.grpc,
            )
            self._gave_up = not ready and exit_code is None
            # A netlink query of the listening sockets (~0.1 ms): on the loop, where a thread
            # hop would cost a busy node more than the query (wakeful.node.sandbox.ports.listeners).
            if ready and not process.owns_port(launch.port):
                self._squatted = True  # another app answered on our port: never route to it
                ready = False
            trace.mark("probed", launch.app)
            settings = self._node.settings
            address = (
                f"tunnel://{settings.node_name}/{self.sandbox_id}"
                if settings.tunnel
                else launch.address
            )
            if ready:
                self.local_target = (launch.host, launch.port)
            ready_at = time.time()  # idleness counts from here at the earliest (`idle_plan`)
            if not ready or not await self._change(
                Transition.READY, address=address, ready=True, ready_at=ready_at
            ):
                self._stop_requested.set()
            else:
                trace.mark("ready", launch.app)
            process.settled()  # after the ready record: a refilled warm slot must not delay it
            tasks.start_soon(self.freezing.follow, process)
            await self._stop_requested.wait()
            self.local_target = None
            self.freezing.since = None  # the stop thaws it first
            exit_code = await process.stop(spec.shutdown_timeout)
            tasks.cancel_scope.cancel()
        return ready, exit_code

    async def _report(
        self, process: SandboxProcess, launch: Launch, ready: bool, exit_code: int | None
    ) -> None:
        """Stopped, when it was asked to stop; dead otherwise, with the reason."""
        tail = last_lines(process.tail(), process.reason())
        current = await self._node.store.get(keys.sandbox(self.sandbox_id), Sandbox)
        if current is None:
            return
        event, last_log = ending(
            stopping=current.value.status is SandboxStatus.STOPPING,
            ready=ready,
            squatted=self._squatted,
            tail=tail,
            timeout=launch.spec.health.timeout,
            port=launch.port,
            gave_up=self._gave_up,
            exit_code=exit_code,
        )
        if event is Transition.FAIL:
            log.warning(
                "sandbox exited with %s", exit_code, extra={"sandbox": self.sandbox_id, "log": tail}
            )
        await self._change(event, exit_code=exit_code, last_log=last_log)

    async def _shut_down(self, process: SandboxProcess, *, agent_stopping: bool) -> None:
        """Take the sandbox out of admission, give the requests on it `shutdown_drain` seconds,
        then stop it and say so. When the whole agent is stopping, its node is cordoned first
        (nothing new may be placed where it would never start); a sandbox that ends alone
        (its record lost to a store error) leaves the node as it is. Store writes are
        bounded: a store that is down must not keep the process running."""
        settings = self._node.settings
        if agent_stopping:
            await self._node.before_shutdown()
        with anyio.move_on_after(STORE_WRITE_BOUND), contextlib.suppress(StoreError):
            await self._change(Transition.DRAIN)
        await anyio.sleep(settings.shutdown_drain)
        with anyio.move_on_after(STORE_WRITE_BOUND), contextlib.suppress(StoreError):
            await self._change(Transition.STOP)
        code = await process.stop(settings.stop_grace)
        with anyio.move_on_after(STORE_WRITE_BOUND), contextlib.suppress(StoreError):
            await self._change(
                Transition.STOPPED, exit_code=code, last_log="the node agent stopped"
            )
        await self._hand_back()


def _discard(chunk: bytes) -> None:
    pass


def _all_store_errors(exc: BaseException) -> bool:
    """A store error, or a task-group group of nothing but store errors."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_all_store_errors(inner) for inner in exc.exceptions)
    return isinstance(exc, StoreError)
