"""The node agent: registers this machine, runs the sandboxes placed on it, reports status.

Theory of operation:
- `nodes/{name}` is bound to a TTL lease the agent keeps alive; if the agent dies the record
  expires and the pool controller treats its sandboxes as dead.
- A watch on `sandboxes/` is the agent's only input: a `pending` sandbox placed here is
  started; one the controller moved to `stopping` (or deleted) is stopped.
- Every status write goes through the lifecycle table (`node.lifecycle`) and is a
  compare-and-set on the sandbox record, retried on conflict against the fresh record, so the
  activator's activity writes and the controller's drains are never overwritten.
- Each sandbox runs in its own task: start, probe until ready (first probe at once, backing
  off to ~100 ms), then wait for exit or a stop request. The exit is noticed immediately and
  recorded with its code and last log lines.
- A sandbox's output goes to a file in its directory and, when the agent has a `LogSink`, to
  a `LogShipper` that pushes it to the control plane in bounded batches (`node.logship`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from wakeful.domain.artifacts import ArtifactError
from wakeful.domain.models import Cordon, Node, Pool, Sandbox, SandboxStatus, SeenNode, Version
from wakeful.store import Conflict, Event, Item, LeaseNotFound, Resync, Store, StoreError

from .lifecycle import IllegalTransition, Transition, transition
from .logship import LogShipper, LogSink
from .ports import NoFreePort, PortPool, bindable
from .probe import wait_ready
from .runtime import ProcessRuntime, Runtime, SandboxProcess
from .settings import NodeSettings
from .workdir import Artifacts, prepare_workdir

log = logging.getLogger(__name__)
HAD_PROCESS = frozenset(
    {SandboxStatus.BOOTING, SandboxStatus.RUNNING, SandboxStatus.DRAINING, SandboxStatus.STOPPING}
)


@dataclass(eq=False)
class Running:
    sandbox_id: str
    stop_requested: anyio.Event = field(default_factory=anyio.Event)
    process: SandboxProcess | None = None
    port: int | None = None


class NodeAgent:
    def __init__(
        self,
        store: Store,
        settings: NodeSettings,
        artifacts: Artifacts,
        runtime: Runtime | None = None,
        clock: Callable[[], float] = time.time,
        logs: LogSink | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._artifacts = artifacts
        self._runtime = runtime or ProcessRuntime()
        self._clock = clock
        self._running: dict[str, Running] = {}
        self._tasks: anyio.abc.TaskGroup | None = None
        self._registered = anyio.Event()
        self._serving = anyio.Event()
        self._node_lease: int | None = None
        self._epochs: dict[str, int] = {}
        """The ownership epoch each sandbox was started at; writes are fenced on it."""
        self._ports = PortPool(*settings.port_range, host=settings.node_address)
        self._cordon_lock = anyio.Lock()
        self._cordoned = False
        self._shipper = (
            None
            if logs is None
            else LogShipper(
                logs,
                settings.node_name,
                interval=settings.log_ship_interval,
                buffer_bytes=settings.log_buffer_bytes,
            )
        )

    @property
    def name(self) -> str:
        return self._settings.node_name

    async def run(self) -> None:
        """Register, adopt nothing from a previous life, then serve until cancelled.

        On cancellation every sandbox this agent started is stopped (SIGTERM, then SIGKILL).
        """
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                tasks.start_soon(self._register_loop)
                if self._shipper is not None:
                    tasks.start_soon(self._shipper.run)
                await self._registered.wait()
                await self._settle_previous_life()
                tasks.start_soon(self._watch_loop)
                self._serving.set()
        finally:
            with anyio.CancelScope(shield=True):
                await self._cordon_once()  # already done if a sandbox was shutting down
                await self._stop_all()
                if self._shipper is not None:  # the last lines, if the control plane listens
                    with anyio.move_on_after(3):
                        await self._shipper.flush()
                if self._node_lease is not None:  # leave at once, not after the TTL
                    with anyio.move_on_after(5), contextlib.suppress(StoreError):
                        await self._store.revoke(self._node_lease)

    async def _settle_previous_life(self) -> None:
        """Lift the cordon our last shutdown left and bury what it ran; a store that is
        briefly unavailable delays this, it never ends the agent (invariant 19)."""
        backoff = 0.5
        while True:
            try:
                await self._lift_own_cordon()
                await self._bury_orphans()
                return
            except StoreError as exc:
                log.warning("store unavailable at start, retrying: %s", exc)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _cordon_once(self) -> None:
        """The agent is stopping: no replacement may be placed here while it does, since
        none would ever start. Done once, before the first sandbox drains; bounded, so a
        store that is down does not keep the process running."""
        async with self._cordon_lock:
            if self._cordoned:
                return
            self._cordoned = True
            with anyio.move_on_after(5), contextlib.suppress(StoreError):
                await self._cordon_self()

    async def _cordon_self(self) -> None:
        key = f"cordons/{self.name}"
        if await self._store.get(key, Cordon) is None:
            cordon = Cordon(node=self.name, evacuate=False, since=self._clock(), by_agent=True)
            with contextlib.suppress(Conflict):
                await self._store.create(key, cordon)

    async def _lift_own_cordon(self) -> None:
        found = await self._store.get(f"cordons/{self.name}", Cordon)
        if found is not None and found.value.by_agent:
            with contextlib.suppress(Conflict):
                await self._store.delete(found.key, expect_revision=found.revision)

    async def wait_registered(self) -> None:
        """Registered, and done with what a previous run left behind."""
        await self._serving.wait()

    # -- registration -----------------------------------------------------------------------

    async def _register_loop(self) -> None:
        record = Node(
            name=self.name, address=self._settings.node_address, capacity=self._settings.capacity
        )
        ttl = self._settings.node_ttl
        while True:
            try:
                lease = self._node_lease = await self._store.grant(ttl)
                await self._store.put(f"nodes/{self.name}", record, lease=lease)
                with contextlib.suppress(Conflict):  # present from an earlier registration
                    await self._store.create(
                        f"seen/{self.name}", SeenNode(name=self.name, first_seen=self._clock())
                    )
                self._registered.set()
                while True:
                    await anyio.sleep(max(0.5, ttl / 3))
                    await self._store.keep_alive(lease)
            except LeaseNotFound:
                log.warning("node lease expired; registering again", extra={"node": self.name})
            except StoreError as exc:
                log.warning("node registration failed: %s", exc, extra={"node": self.name})
                await anyio.sleep(1)

    async def _bury_orphans(self) -> None:
        """Sandboxes recorded on this node from a previous run have no process any more."""
        listing = await self._store.list("sandboxes/", Sandbox)
        for item in listing.items:
            sandbox = item.value
            mine = sandbox.id not in self._running and (
                sandbox.owner == self.name or _unowned(sandbox, self.name)
            )
            # Only states in which a process of ours existed; a pending one is started below.
            if mine and sandbox.status in HAD_PROCESS:
                await self._change(sandbox.id, Transition.FAIL, last_log="the node agent restarted")

    # -- watching ---------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        while True:
            try:
                listing = await self._store.list("sandboxes/", Sandbox)
                placed_here = {i.value.id for i in listing.items if i.value.node == self.name}
                for sandbox_id, running in list(self._running.items()):
                    if sandbox_id not in placed_here:  # deleted or moved while we were away
                        running.stop_requested.set()
                for item in listing.items:
                    self._consider(item.value)
                async for change in self._store.watch("sandboxes/", listing.revision + 1):
                    if isinstance(change, Resync):
                        break
                    self._on_event(change)
            except StoreError as exc:
                log.warning("sandbox watch failed: %s", exc)
                await anyio.sleep(1)

    def _on_event(self, event: Event) -> None:
        sandbox_id = event.key.removeprefix("sandboxes/")
        if event.kind == "delete":
            running = self._running.get(sandbox_id)
            if running is not None:
                running.stop_requested.set()
            return
        self._consider(event.decode(Sandbox))

    def _consider(self, sandbox: Sandbox) -> None:
        if sandbox.node != self.name:
            return
        running = self._running.get(sandbox.id)
        if sandbox.status is SandboxStatus.PENDING and running is None:
            assert self._tasks is not None
            running = self._running[sandbox.id] = Running(sandbox.id)
            self._tasks.start_soon(self._serve, running)
        elif sandbox.status is SandboxStatus.STOPPING and running is not None:
            running.stop_requested.set()

    # -- one sandbox ------------------------------------------------------------------------

    async def _serve(self, running: Running) -> None:
        sandbox_id = running.sandbox_id
        try:
            await self._serve_inner(running)
        except StoreError as exc:
            log.error("lost track of sandbox: %s", exc, extra={"sandbox": sandbox_id})
        except Exception:
            # One sandbox's failure must not take the agent and every other sandbox down.
            log.exception("sandbox failed", extra={"sandbox": sandbox_id})
            with anyio.CancelScope(shield=True), contextlib.suppress(StoreError):
                await self._change(sandbox_id, Transition.FAIL, last_log="node agent error")
        finally:
            self._running.pop(sandbox_id, None)
            if running.port is not None:
                self._ports.give_back(running.port)
            if running.process is not None:
                with anyio.CancelScope(shield=True):
                    await self._shut_down(sandbox_id, running.process)
            self._epochs.pop(sandbox_id, None)
            if self._shipper is not None:
                self._shipper.close(sandbox_id)

    async def _shut_down(self, sandbox_id: str, process: SandboxProcess) -> None:
        """The agent is stopping: cordon the node, take the sandbox out of admission, give the
        requests on it `shutdown_drain` seconds, then stop it and say so. Store writes are
        bounded: a store that is down must not keep the process running."""
        await self._cordon_once()
        with anyio.move_on_after(5), contextlib.suppress(StoreError):
            await self._change(sandbox_id, Transition.DRAIN)
        await anyio.sleep(self._settings.shutdown_drain)
        with anyio.move_on_after(5), contextlib.suppress(StoreError):
            await self._change(sandbox_id, Transition.STOP)
        code = await process.stop(self._settings.stop_grace)
        with anyio.move_on_after(5), contextlib.suppress(StoreError):
            await self._change(
                sandbox_id, Transition.STOPPED, exit_code=code, last_log="the node agent stopped"
            )

    async def _serve_inner(self, running: Running) -> None:
        sandbox_id = running.sandbox_id
        item = await self._store.get(f"sandboxes/{sandbox_id}", Sandbox)
        if item is None or item.value.status is not SandboxStatus.PENDING:
            return
        if item.value.owner != self.name and not _unowned(item.value, self.name):
            log.warning(
                "placed here but owned by %s", item.value.owner, extra={"sandbox": sandbox_id}
            )
            return
        self._epochs[sandbox_id] = max(item.value.epoch, 1)
        pool = await self._store.get(f"pools/{item.value.pool}", Pool)
        if pool is None:
            await self._change(sandbox_id, Transition.FAIL, last_log="its pool no longer exists")
            return
        spec = pool.value.spec
        version = await self._store.get(f"versions/{pool.value.app}/{pool.value.version}", Version)
        base = self._settings.data_dir / "sandboxes" / sandbox_id
        try:
            workdir = await prepare_workdir(
                base / "app", self._artifacts, version.value.artifact if version else None
            )
        except (OSError, ArtifactError) as exc:
            await self._change(sandbox_id, Transition.FAIL, last_log=f"could not unpack: {exc}")
            return
        if spec.port is not None:
            port = spec.port
            if not bindable(port, self._settings.node_address):
                await self._change(
                    sandbox_id, Transition.FAIL, last_log=f"port {port} is already in use"
                )
                return
        else:
            try:
                port = self._ports.take()
            except NoFreePort as exc:
                await self._change(sandbox_id, Transition.FAIL, last_log=str(exc))
                return
            running.port = port
        host = self._settings.node_address
        env = {**_base_env(), **spec.env, "PORT": str(port), "HOST": host}
        if not await self._change(sandbox_id, Transition.START):
            return
        try:
            process = await self._runtime.start(spec.command, env, workdir, base / "output.log")
        except OSError as exc:
            await self._change(sandbox_id, Transition.FAIL, last_log=f"could not start: {exc}")
            return
        running.process = process
        forward = (
            _discard
            if self._shipper is None
            else self._shipper.open(sandbox_id, item.value.app, item.value.created_at)
        )
        address = f"{self._settings.node_address}:{port}"
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
                host, port, spec.health.path, spec.health.timeout, process.wait
            )
            if not ready or not await self._change(
                sandbox_id, Transition.READY, address=address, ready=True
            ):
                running.stop_requested.set()
            await running.stop_requested.wait()
            exit_code = await process.stop(spec.shutdown_timeout)
            tasks.cancel_scope.cancel()
        running.process = None
        tail = process.tail()
        current = await self._store.get(f"sandboxes/{sandbox_id}", Sandbox)
        if current is None:
            return
        if current.value.status is SandboxStatus.STOPPING:
            await self._change(sandbox_id, Transition.STOPPED, exit_code=exit_code, last_log=tail)
        else:
            reason = tail if ready else (tail or f"not ready within {spec.health.timeout:g} s")
            log.warning(
                "sandbox exited with %s", exit_code, extra={"sandbox": sandbox_id, "log": tail}
            )
            await self._change(sandbox_id, Transition.FAIL, exit_code=exit_code, last_log=reason)

    async def _change(self, sandbox_id: str, event: Transition, **fields: object) -> bool:
        """Apply a lifecycle event by compare-and-set; False when it no longer applies.

        Fenced (invariant 15): only while this node owns the record at the epoch it started
        the sandbox at. Once ownership was released or moved (the epoch went up), every
        write of ours is refused, even one the lifecycle table would allow.
        """
        key = f"sandboxes/{sandbox_id}"
        for _ in range(20):
            item = await self._store.get(key, Sandbox)
            if item is None:
                return False
            epoch = self._epochs.get(sandbox_id, item.value.epoch)
            adopt = _unowned(item.value, self.name)
            if not adopt and (item.value.owner != self.name or item.value.epoch != epoch):
                log.warning(
                    "not writing %s: the sandbox is owned by %s at epoch %d now",
                    event.value,
                    item.value.owner,
                    item.value.epoch,
                    extra={"sandbox": sandbox_id},
                )
                return False
            try:
                status = transition(item.value.status, event)
            except IllegalTransition as exc:
                log.info("skipping %s: %s", event.value, exc, extra={"sandbox": sandbox_id})
                return False
            owned = {"owner": self.name, "epoch": 1} if adopt else {}
            updated = item.value.model_copy(update={"status": status, **owned, **fields})
            if status is not SandboxStatus.RUNNING:
                updated = updated.model_copy(update={"ready": False})
            try:
                await self._store.update(key, updated, expect_revision=item.revision)
                return True
            except Conflict:
                continue
        return False

    async def _stop_all(self) -> None:
        for running in list(self._running.values()):
            running.stop_requested.set()
        with anyio.move_on_after(self._settings.stop_grace + 5):
            async with anyio.create_task_group() as tasks:
                for running in list(self._running.values()):
                    if running.process is not None:
                        tasks.start_soon(running.process.stop, self._settings.stop_grace)

    def running_ids(self) -> list[str]:
        return sorted(self._running)


def _unowned(sandbox: Sandbox, node: str) -> bool:
    """Placed on `node` but never owned (epoch 0: written before ownership existed, or by a
    tool that does not set it). The node adopts it with its first write, at epoch 1. A record
    whose ownership was released has a later epoch and is never adopted."""
    return sandbox.owner is None and sandbox.epoch == 0 and sandbox.node == node


def _discard(chunk: bytes) -> None:
    pass


def _base_env() -> dict[str, str]:
    """What a sandbox inherits: a PATH to find its interpreter, a locale, a home. No secrets."""
    keep = ("PATH", "LANG", "LC_ALL", "HOME", "TZ", "PYTHONPATH", "VIRTUAL_ENV")
    return {name: os.environ[name] for name in keep if name in os.environ}


def sandbox_dir(data_dir: Path, sandbox_id: str) -> Path:
    return data_dir / "sandboxes" / sandbox_id


def remove_sandbox_dir(data_dir: Path, sandbox_id: str) -> None:
    shutil.rmtree(sandbox_dir(data_dir, sandbox_id), ignore_errors=True)


__all__ = ["Item", "NodeAgent"]
