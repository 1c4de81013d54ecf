"""The node agent: registers this machine, watches the sandboxes placed on it, hands each to
a runner.

Theory of operation:
- `nodes/{name}` is bound to a TTL lease the agent keeps alive (`node.registration`); if the
  agent dies the record expires and the pool controller treats its sandboxes as dead.
- A watch on `sandboxes/` is the agent's only input: a `pending` sandbox placed here gets a
  `SandboxRunner` (`node.sandbox.runner`: prepare, start, probe, wait, report) in the agent's
  task group; one the controller moved to `stopping` (or deleted) is told to stop.
- Every status write goes through one `SandboxWriter` (`node.writer`): fenced on ownership
  (`node.fencing`, invariant 15), along the lifecycle table (`wakeful.domain.lifecycle`), by
  compare-and-set on the sandbox record, retried on conflict against the fresh record, so the
  activator's activity writes and the controller's drains are never overwritten.
- A sandbox's secrets come from a `SecretSource` (`node.secrets`) at its start, in memory only.
- A sandbox's output goes to a file in its directory and, when the agent has a `LogSink`, to
  a `LogShipper` that pushes it to the control plane in bounded batches (`node.logship`).
- Stopping, the agent cordons its node first (`node.cordon`), then stops every sandbox. Where a
  cgroup freezes sandboxes, a thaw guard (`node.jail.guarding`) thaws them if the agent dies
  without doing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from wakeful.aio.backoff import retry
from wakeful.domain import coverage, keys
from wakeful.domain.backoff import Backoff
from wakeful.domain.lifecycle import Transition
from wakeful.domain.models import (
    HAS_PROCESS,
    ImageCacheUse,
    Sandbox,
    SandboxStatus,
    Tunnel,
    Version,
)
from wakeful.node.images import ImageCache
from wakeful.node.images.warming import Warming
from wakeful.node.jail.guarding import GuardKeeper
from wakeful.node.jail.peers import ControlFence, PeerFence
from wakeful.node.jail.thawguard import thaw_left
from wakeful.node.sandbox.local import ProcessRuntime, isolation_of, runtime_for
from wakeful.node.sandbox.ports import PortPool
from wakeful.node.sandbox.runner import NodeServices, SandboxRunner
from wakeful.node.sandbox.runtime import Runtime
from wakeful.node.sandbox.workdir import (
    Artifacts,
    clear_sandboxes,
    remove_sandbox_dir,
    sandbox_dir,
)
from wakeful.node.state.hold import Keeper, StateHold
from wakeful.node.tunnel.client import TunnelClient
from wakeful.store import Item, Store, StoreError
from wakeful.store.reflector import reflect

from .cordon import OwnCordon
from .fencing import claims
from .logship import LogShipper, LogSink
from .registration import Registration
from .secrets import SecretSource
from .settings import NodeSettings, memory_share
from .suspended import evictions, meminfo
from .writer import SandboxWriter

log = logging.getLogger(__name__)
SUSPENDED_EVERY = 2.0
"""Seconds between two looks at the memory suspended sandboxes hold (`check_suspended`)."""
MAX_EVICT = 1000
"""The most sandboxes one node record lists in `evict` (what `Node` validates)."""
SETTLE_BACKOFF = Backoff(0.5, cap=5.0)
"""Between tries to settle what a previous run left, while the store or a disk fails."""


class NodeAgent:
    def __init__(
        self,
        store: Store,
        settings: NodeSettings,
        artifacts: Artifacts,
        keeper: Keeper,
        secrets: SecretSource,
        runtime: Runtime | None = None,
        clock: Callable[[], float] = time.time,
        logs: LogSink | None = None,
        tunnel_token: str | None = None,
        memory: Callable[[], tuple[int, int]] = meminfo,
        agent: str = "",
    ) -> None:
        """`keeper`: where stateful apps' states go back to (the control plane: it stores
        their archives and writes their records). `secrets`: each app's secrets, asked for at
        its sandbox's start (the control plane's, in process or over HTTP). `tunnel_token`:
        the node token its tunnel streams carry (with `settings.tunnel`); `memory`: the
        machine's (total, available) memory, for the suspended tier's cap; `agent`: its
        identity in the node's record (`node.registration.agent_identity`)."""
        self._store = store
        self._memory = memory
        self._guard: GuardKeeper | None = None
        self._settings = settings
        self._clock = clock
        self._running: dict[str, SandboxRunner] = {}
        self._tasks: anyio.abc.TaskGroup | None = None
        self._serving = anyio.Event()
        self._cordon = OwnCordon(store, settings.node_name, clock)
        self._writer = SandboxWriter(store, settings.node_name)
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
        runtime = runtime or runtime_for(settings)
        self._isolation = isolation_of(runtime)
        self._registration = Registration(store, settings, self._isolation, clock, agent)
        """`nodes/{node}`, under a TTL lease: gone when the agent is."""
        self.warming: Warming | None = None
        """Newly deployed images unpacked ahead of their first start (a runtime with images)."""
        self.tunnel: TunnelClient | None = None
        if settings.tunnel:
            if not tunnel_token:
                raise ValueError("WAKEFUL_TUNNEL needs the node's token (WAKEFUL_NODE_TOKEN)")
            self.tunnel = TunnelClient(
                settings.tunnel,
                settings.node_name,
                tunnel_token,
                self.tunnel_target,
                self.publish_tunnel,
                limits=coverage.Limits(
                    node_cap=settings.tunnel_streams_max,
                    replica_cap=settings.tunnel_streams_per_replica,
                    prune_unused=settings.tunnel_prune_unused,
                    prune_min_age=settings.tunnel_prune_min_age,
                ),
                ca_file=str(settings.tunnel_ca) if settings.tunnel_ca else None,
            )
        self.states = StateHold(
            store,
            artifacts,
            keeper,
            settings.node_name,
            settings.data_dir,
            settings.state_max_bytes,
        )
        self._services = NodeServices(
            store=store,
            settings=settings,
            artifacts=artifacts,
            runtime=runtime,
            ports=PortPool(*settings.port_range, host=settings.node_address),
            writer=self._writer,
            shipper=self._shipper,
            before_shutdown=self._cordon_own,
            states=self.states,
            secrets=secrets,
        )

    @property
    def name(self) -> str:
        return self._settings.node_name

    async def run(self) -> None:
        """Register, adopt nothing from a previous life, then serve until cancelled.

        Its process holds the data directory and the node's name first (`held_data_dir`,
        `claim`). On cancellation every sandbox this agent started is stopped (SIGTERM, then
        SIGKILL).
        """
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                tasks.start_soon(self._registration.run)
                if self._shipper is not None:
                    tasks.start_soon(self._shipper.run)
                await self._registration.held.wait()
                await self._settle_previous_life()
                # Nothing of ours runs yet: what a previous life left on disk (a crash leaves
                # sandbox directories and their tmpfs mounts) goes before anything starts.
                freezer = self._freezer()
                if freezer is not None:  # frozen by a crashed run whose guard died with it
                    thaw_left(self._sandboxes, freezer)
                await anyio.to_thread.run_sync(clear_sandboxes, self._settings.data_dir)
                if freezer is not None:  # what this run freezes, should it die
                    self._guard = GuardKeeper(self._sandboxes, freezer)
                    self._guard.start()
                    tasks.start_soon(self._guard.run)
                if isinstance(self._services.runtime, ProcessRuntime):
                    tasks.start_soon(self._services.runtime.keep_warm)
                    if self._services.runtime.images is not None:
                        tasks.start_soon(self._warm_images, self._services.runtime)
                    jail = self._services.runtime.jail
                    if jail is not None and jail.fenced:  # no sandbox starts before the fence
                        await tasks.start(PeerFence(self._store, self.name).run)
                        tasks.start_soon(ControlFence(jail.control_urls).run)
                tasks.start_soon(self._watch_loop)
                tasks.start_soon(self.states.run, self.running_ids)
                tasks.start_soon(self._suspended_loop)
                if self.tunnel is not None:
                    tasks.start_soon(self.tunnel.run)
                self._serving.set()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._cordon_own()  # done if a sandbox was shutting down
                    await self._stop_all()
                finally:
                    if self._guard is not None:  # nothing of ours is frozen now
                        await self._guard.close()
                if self._shipper is not None:  # the last lines, if the control plane listens
                    with anyio.move_on_after(3):
                        await self._shipper.flush()
                await self._registration.release(within=5)  # leave now, not after the TTL

    async def _cordon_own(self) -> None:
        """Cordon the node as this agent stops (once), unless the node is another agent's
        now (`Registration.taken`): at its start, or after this one's record lapsed."""
        if not self._registration.taken:
            await self._cordon.once()

    def _freezer(self) -> Path | None:
        runtime = self._services.runtime
        return runtime.freezer if isinstance(runtime, ProcessRuntime) else None

    @property
    def _sandboxes(self) -> Path:
        """Where this agent's sandbox directories are (each named by its sandbox's id)."""
        return sandbox_dir(self._settings.data_dir, "x").parent

    async def _settle_previous_life(self) -> None:
        """Lift the cordon our last shutdown left and bury what it ran; a store that is
        briefly unavailable delays this, it never ends the agent (invariant 19)."""

        async def settle() -> None:
            await self._cordon.lift()
            listing = await self._store.list(keys.SANDBOXES, Sandbox)
            await self._bury_orphans(listing.items)
            # What a killed run's stateful sandboxes wrote, before their trees are cleared.
            await self.states.salvage(listing.items)

        def failed(exc: Exception, pause: float) -> None:
            log.warning("cannot settle what the previous run left, retrying: %s", exc)

        # OSError: a salvage's disk
        await retry(settle, SETTLE_BACKOFF, errors=(StoreError, OSError), failed=failed)

    async def wait_registered(self) -> None:
        """Registered, and done with what a previous run left behind."""
        await self._serving.wait()

    async def _suspended_loop(self) -> None:
        while True:
            await anyio.sleep(SUSPENDED_EVERY)
            try:
                await self.check_suspended()
            except (StoreError, OSError) as exc:
                log.warning("cannot publish suspended sandboxes: %s", exc)

    async def check_suspended(self) -> tuple[int, list[str]]:
        """Publish the frozen sandboxes' count and memory in the node record, with how much
        of it to give up (past `WAKEFUL_SUSPENDED_MEMORY`, or while less than
        `WAKEFUL_SUSPENDED_MEMORY_FLOOR` is available) in `evict_bytes` and the sandboxes to
        take it from in `evict`. Returns both (the sandboxes by name)."""
        total, available = self._memory()
        cap = memory_share(self._settings.suspended_memory, total)
        floor = memory_share(self._settings.suspended_memory_floor, total)
        frozen = [
            (runner.freezing.since, runner.sandbox_id, runner.freezing.held)
            for runner in self._running.values()
            if runner.freezing.since is not None
        ]
        pressure = available < floor
        wanted, candidates = evictions(frozen, cap, pressure)
        evict = candidates[:MAX_EVICT]
        update = {
            "suspended": len(frozen),
            "suspended_memory": sum(held for _, _, held in frozen),
            "suspended_memory_cap": cap,
            "memory_pressure": pressure,
            "evict_bytes": wanted,
            "evict": evict,
        }
        runtime = self._services.runtime
        if isinstance(runtime, ProcessRuntime) and isinstance(runtime.images, ImageCache):
            used = runtime.images.stats()
            update["image_cache"] = ImageCacheUse(
                images=used.images,
                bytes=used.bytes,
                bound=self._settings.image_cache,
                hits=used.hits,
                misses=used.misses,
            )
        await self._registration.update(update)
        return wanted, [frozen.sandbox for frozen in evict]

    async def publish_tunnel(self, table: Tunnel) -> None:
        """Rewrite the node record with the tunnel's coverage table (under its lease)."""
        await self._registration.publish_tunnel(table)

    def tunnel_target(self, sandbox_id: str) -> tuple[str, int] | None:
        """Where a tunnel exchange naming `sandbox_id` connects: only a sandbox this agent
        runs and has seen ready."""
        runner = self._running.get(sandbox_id)
        return None if runner is None else runner.local_target

    async def _bury_orphans(self, items: list[Item[Sandbox]]) -> None:
        """Sandboxes recorded on this node from a previous run have no process any more."""
        for item in items:
            sandbox = item.value
            mine = sandbox.id not in self._running and claims(sandbox, self.name)
            # Only states in which a process of ours existed; a pending one is started below.
            if mine and sandbox.status in HAS_PROCESS:
                await self._writer.change(
                    sandbox.id, Transition.FAIL, last_log="the node agent restarted"
                )

    async def _warm_images(self, runtime: ProcessRuntime) -> None:
        """Every newly deployed image, unpacked here before its first start (`Warming`)."""
        warming = self.warming = Warming(runtime.warm)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(warming.run)
            await reflect(self._store, keys.VERSIONS, Version, warming, what="image warming")

    # -- watching ---------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        await reflect(self._store, keys.SANDBOXES, Sandbox, self, what="node agent")

    # The reflector's view of `sandboxes/` (wakeful.store.reflector): start what is placed here
    # and pending, stop what left, was moved away, or is being stopped.

    def replace(self, items: list[Item[Sandbox]], revision: int) -> None:
        placed_here = {i.value.id for i in items if i.value.node == self.name}
        for sandbox_id, runner in list(self._running.items()):
            if sandbox_id not in placed_here:  # deleted or moved while we were away
                runner.stop()
        for item in items:
            self._consider(item)

    def put(self, item: Item[Sandbox]) -> None:
        self._consider(item)

    def delete(self, key: str, revision: int) -> None:
        runner = self._running.get(keys.name_in(key, keys.SANDBOXES))
        if runner is not None:
            runner.stop()

    def _consider(self, item: Item[Sandbox]) -> None:
        sandbox = item.value
        if sandbox.node != self.name:
            return
        runner = self._running.get(sandbox.id)
        never_started = (
            sandbox.status is SandboxStatus.STOPPING and sandbox.address is None and not runner
        )
        if (sandbox.status is SandboxStatus.PENDING or never_started) and runner is None:
            # A sandbox stopped before this agent started it has no process anywhere: its
            # runner only marks it stopped (`SandboxRunner._claim`).
            assert self._tasks is not None
            runner = self._running[sandbox.id] = SandboxRunner(sandbox.id, self._services, item)
            self._tasks.start_soon(self._serve, runner)
        elif sandbox.status is SandboxStatus.STOPPING and runner is not None:
            runner.stop()
        if runner is not None:
            runner.freezing.want(sandbox.status is SandboxStatus.SUSPENDED)

    async def _serve(self, runner: SandboxRunner) -> None:
        try:
            await runner.run()
        finally:
            # No await between the runner setting `finished` and this: see `wait_finished`.
            self._running.pop(runner.sandbox_id, None)

    async def _stop_all(self) -> None:
        for runner in list(self._running.values()):
            runner.stop()
        with anyio.move_on_after(self._settings.stop_grace + 5):
            async with anyio.create_task_group() as tasks:
                for runner in list(self._running.values()):
                    tasks.start_soon(runner.stop_process, self._settings.stop_grace)

    def running_ids(self) -> list[str]:
        return sorted(self._running)

    async def wait_finished(self, sandbox_id: str) -> None:
        """Until this agent runs nothing for `sandbox_id` (at once if it runs nothing now).

        Its runner sets `finished` as its last step and the agent forgets it in the same step
        (no await between), so once this returns `running_ids()` no longer lists it.
        """
        runner = self._running.get(sandbox_id)
        if runner is not None:
            await runner.finished.wait()


__all__ = ["Item", "NodeAgent", "remove_sandbox_dir", "sandbox_dir"]
