"""`wakeful ingress --workers N`: N ingress processes on one client port, each a replica.

One ingress process uses one core (one event loop). Workers are whole ingresses, started,
supervised and stopped together by this module:

- The client listeners (`listen`, `tls_listen`) are shared with SO_REUSEPORT. The supervisor
  binds each address first without listening: that resolves a port 0, keeps the port (and its
  loopback twin) for the workers, and takes no connection. Each worker binds the same address
  with SO_REUSEPORT and listens; the kernel spreads new connections across the listening ones.
  A worker that dies closes its socket, and the others take its share until it is back.
- Everything else a replica owns is the worker's own: its name `<replica>-w<i>` (in the
  access lines, `ingresses/` and nodes' coverage tables), its lease channel and cache, its
  tunnel listener at the tunnel port + i, advertised so (a peer relaying to a replica must
  reach that one, not whichever worker the kernel picks), and an admin listener on a loopback
  port the supervisor keeps.
- The supervisor serves the admin address: /healthz; /readyz, ready while at least one worker
  is and until a stop begins; /metrics, every worker's families with each sample labelled
  `worker="i"`, and the supervisor's own (`wakeful_ingress_workers_ready`,
  `wakeful_ingress_worker_restarts_total`).
- A worker that exits is started again after a pause (1 s, doubling up to 30 s; back to 1 s
  once it ran a minute); so is one that stopped answering its /readyz for 30 s, killed
  (`workerrules.hung`). One that exits before it was ever ready ends them all: a
  configuration error is shown once, not in a loop.
- A client port held only by closing connections (TIME_WAIT, left by an ingress that ran
  without workers) is waited for, at most `CLOSING_WAIT` seconds, where it was refused.
- SIGTERM or SIGINT to the supervisor goes to every worker, once (workers run in their own
  session, so a terminal's Ctrl-C reaches the supervisor alone); each drains as a single
  ingress does (`shutdown_timeout`), and one still running 10 s after that is killed. Workers
  get SIGTERM when the supervisor dies (`setpriv --pdeathsig`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from wakeful.aio.spawn import Child, spawn
from wakeful.ingress.admin import AdminEdge
from wakeful.ingress.http1 import HttpServer, Limits
from wakeful.ingress.nodestreams import default_replica_name
from wakeful.ingress.ports import address_of, bind_listener, reserve, reserved
from wakeful.ingress.settings import IngressSettings, join_address, split_address
from wakeful.ingress.workerrules import HUNG, hung, restart_pause, share, shifted

log = logging.getLogger(__name__)

KILL_MARGIN = 10.0
"""Seconds past `shutdown_timeout` a stopping worker gets before it is killed."""
POLL = 0.5
"""Seconds between two looks at each worker's /readyz."""


def tunnel_listeners(settings: IngressSettings) -> str | None:
    """What the supervisor says of its workers' tunnel listeners, when it has one: each
    worker's port, which the nodes' tunnel balancer must list (a stream may land on any
    replica, but each worker is one, with a port of its own)."""
    if settings.tunnel_listen is None:
        return None
    host, port = split_address(settings.tunnel_listen)
    if not port:
        return "tunnel listeners: each worker's on a free port (its log line names it)"
    ports = ", ".join(join_address(host, port + i) for i in range(settings.workers))
    return f"tunnel listeners: {ports} (the tunnel balancer lists each)"


def worker_env(
    settings: IngressSettings,
    index: int,
    *,
    listen: str,
    tls_listen: str | None,
    admin: str,
    replica: str,
) -> dict[str, str]:
    """The variables that make worker `index` of this ingress (over the supervisor's own)."""
    env = {
        "WAKEFUL_INGRESS_WORKERS": "1",
        "WAKEFUL_INGRESS_WORKER": str(index),
        "WAKEFUL_LISTEN": listen,
        "WAKEFUL_ADMIN_LISTEN": admin,
        "WAKEFUL_TUNNEL_REPLICA": f"{replica}-w{index}",
        # The rate bounds the ingress's log, not each process's: a share each, the shares
        # adding up to it (at least one line a second each, a setting's least).
        "WAKEFUL_ACCESS_LOG_RATE": str(share(settings.access_log_rate, settings.workers, index)),
    }
    if tls_listen is not None:
        env["WAKEFUL_TLS_LISTEN"] = tls_listen
    if settings.tunnel_listen is not None:
        env["WAKEFUL_TUNNEL_LISTEN"] = shifted(settings.tunnel_listen, index)
    if settings.tunnel_advertise is not None:
        env["WAKEFUL_TUNNEL_ADVERTISE"] = shifted(settings.tunnel_advertise, index)
    return env


def labelled(texts: Iterable[tuple[int, str]]) -> list[Metric]:
    """Every worker's exposition as one: families merged by name, each sample labelled with
    its worker. A text that does not parse is left out (a worker mid-restart)."""
    merged: dict[str, Metric] = {}
    for index, text in texts:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:
            log.warning("worker %d's metrics do not parse; left out", index)
            continue
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = Metric(family.name, family.documentation, family.type, family.unit)
                merged[family.name] = into
            worker = str(index)
            into.samples.extend(
                Sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            )
    return list(merged.values())


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


@dataclass(eq=False)
class Worker:
    index: int
    env: dict[str, str]
    admin: str
    process: Child | None = None
    ready: bool = False
    ever_ready: bool = False
    up: bool = False
    """This process (not an earlier one of the worker) has been ready."""
    silent_since: float | None = None
    """When this process, ready before, stopped answering /readyz at all (`hung`): no
    answer in time, or no connection. A 503 (draining) is an answer."""


@dataclass(eq=False)
class Supervisor:
    """Keeps the workers running; see the module docstring for the rules."""

    workers: list[Worker]
    command: Sequence[str]
    stop_timeout: float
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """The variables every worker starts with (its own `Worker.env` over them)."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    clock: Callable[[], float] = time.monotonic
    on_ready: Callable[[], None] = lambda: None
    """Called once, when every worker has been ready."""
    stopping: bool = False
    failed: str | None = None
    """Why the workers were stopped before a signal: one never became ready."""

    def __post_init__(self) -> None:
        self._ready = Gauge(
            "wakeful_ingress_workers_ready",
            "Ingress workers answering /readyz now.",
            registry=self.registry,
        )
        self._ready.set_function(lambda: sum(w.ready for w in self.workers))
        self._restarts = Counter(
            "wakeful_ingress_worker_restarts",
            "Ingress workers started again after they exited.",
            ["worker"],
            registry=self.registry,
        )
        self._done = anyio.Event()

    def is_ready(self) -> bool:
        return not self.stopping and any(w.ready for w in self.workers)

    async def metrics(self) -> bytes:
        """The supervisor's own metrics, then every running worker's, labelled (one that
        does not answer in 2 s is left out)."""
        texts: list[tuple[int, str]] = []

        async def fetch(client: httpx.AsyncClient, worker: Worker) -> None:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"http://{worker.admin}/metrics")
                if answer.status_code == 200:
                    texts.append((worker.index, answer.text))

        async with (
            httpx.AsyncClient(timeout=2.0, trust_env=False) as client,  # loopback: no proxy
            anyio.create_task_group() as tg,
        ):
            for worker in self.workers:
                if worker.process is not None:
                    tg.start_soon(fetch, client, worker)
        texts.sort()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(labelled(texts)))
        return generate_latest(self.registry) + generate_latest(registry)

    async def run(self) -> None:
        """Start every worker and keep them running until `stop` (or one fails to start);
        returns once every worker has ended, also when cancelled."""
        try:
            async with anyio.create_task_group() as keepers:
                for worker in self.workers:
                    keepers.start_soon(self._keep, worker)
                async with anyio.create_task_group() as watching:
                    watching.start_soon(self._watch)
                    await self._done.wait()
                    watching.cancel_scope.cancel()
                await self._stop(self.workers)  # the keepers then end on their own
        finally:  # cancelled from outside (its caller failed): the workers still stop
            self.stopping = True
            await self._stop(self.workers)

    def stop(self) -> None:
        self.stopping = True
        self._done.set()

    async def _keep(self, worker: Worker) -> None:
        pause: float | None = None
        while not self.stopping:
            started = self.clock()
            with anyio.CancelScope(shield=True):  # a child started is always waited for
                process = worker.process = await spawn(  # vfork, not a fork of this process
                    self.command,
                    cwd=None,
                    env={**self.environ, **worker.env},
                    stdout=None,
                    stderr=None,
                )
            if self.stopping:  # the stop began while it was started: `run` may not see it
                await self._stop([worker])
            code = await process.wait()
            worker.process, worker.ready, worker.up, worker.silent_since = None, False, False, None
            if self.stopping:
                return
            if not worker.ever_ready:
                self.failed = (
                    f"ingress worker {worker.index} exited with status {code} before it was "
                    "ready (its error is above); the other workers were stopped"
                )
                self.stop()
                return
            pause = restart_pause(pause, self.clock() - started)
            log.warning(
                "ingress worker %d exited with status %s; starting it again in %.0f s",
                worker.index,
                code,
                pause,
            )
            self._restarts.labels(worker=str(worker.index)).inc()
            with anyio.move_on_after(pause):
                await self._done.wait()  # a stop ends the pause

    async def _watch(self) -> None:
        told = False
        async with httpx.AsyncClient(timeout=POLL * 2, trust_env=False) as client:
            while True:
                async with anyio.create_task_group() as tg:
                    for worker in self.workers:
                        tg.start_soon(self._look, client, worker)
                if not told and all(w.ever_ready for w in self.workers):
                    told = True
                    self.on_ready()
                await anyio.sleep(POLL)

    async def _look(self, client: httpx.AsyncClient, worker: Worker) -> None:
        ready = answered = False
        process = worker.process
        if process is not None:
            with contextlib.suppress(httpx.HTTPError):
                status = (await client.get(f"http://{worker.admin}/readyz")).status_code
                answered, ready = True, status == 200
        now = self.clock()
        if answered:
            worker.silent_since = None
        elif worker.up and worker.silent_since is None:
            worker.silent_since = now
        worker.ready = ready and worker.process is not None
        worker.up = worker.up or worker.ready
        worker.ever_ready = worker.ever_ready or worker.ready
        if process is not None and process is worker.process and hung(worker.silent_since, now):
            log.warning(
                "ingress worker %d has not answered its /readyz for %.0f s; killing it",
                worker.index,
                HUNG,
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # `_keep` sees it exit and starts it again

    async def _stop(self, workers: list[Worker]) -> None:
        """SIGTERM to each running worker, once; SIGKILL to those still running after the
        timeout."""
        with anyio.CancelScope(shield=True):
            running = [w.process for w in workers if w.process is not None]
            for process in running:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(self.stop_timeout):
                for process in running:
                    await process.wait()
            for process in running:
                if process.returncode is None:
                    log.warning("ingress worker pid %d did not stop in time; killed", process.pid)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()


def worker_command() -> list[str]:
    """`wakeful ingress` on this interpreter, under `setpriv --pdeathsig TERM` when there is
    one (util-linux): a worker outliving a killed supervisor would hold the port for ever."""
    command = [sys.executable, "-m", "wakeful.cli", "ingress"]
    setpriv = shutil.which("setpriv")
    return command if setpriv is None else [setpriv, "--pdeathsig", "TERM", "--", *command]


async def supervise(
    settings: IngressSettings,
    *,
    announce: Callable[[str], None],
    wait_for_stop: Callable[[], Awaitable[object]],
    command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    bound: Callable[[tuple[str, int], tuple[str, int] | None, tuple[str, int]], None] = (
        lambda *_: None
    ),
) -> str | None:
    """Run `settings.workers` ingress workers until `wait_for_stop` returns; returns why they
    ended early (a worker that never became ready), or None after a clean stop. `env`: the
    workers' variables (this process's by default); `bound`: told the client, TLS (None
    without one) and admin addresses once they are bound, a port 0 resolved."""
    with contextlib.ExitStack() as held:
        listen = address_of(held.enter_context(await reserved(settings.listen, "listen address")))
        tls_listen = None
        if settings.tls_listen is not None:
            tls = held.enter_context(await reserved(settings.tls_listen, "TLS listen address"))
            tls_listen = address_of(tls)
        replica = settings.tunnel_replica or default_replica_name(listen)
        tunnels = tunnel_listeners(settings)
        workers = []
        for index in range(settings.workers):
            admin = address_of(held.enter_context(reserve("127.0.0.1:0", "worker admin port")))
            own = worker_env(
                settings, index, listen=listen, tls_listen=tls_listen, admin=admin, replica=replica
            )
            workers.append(Worker(index, own, admin))
        supervisor = Supervisor(
            workers,
            command or worker_command(),
            settings.shutdown_timeout + KILL_MARGIN,
            dict(os.environ if env is None else env),
            on_ready=lambda: announce(
                f"{settings.listening(listen, tls_listen)} ({len(workers)} workers)"
                + ("" if tunnels is None else f"\n{tunnels}")
            ),
        )
        admin_server = HttpServer(
            AdminEdge(supervisor.metrics, supervisor.is_ready), Limits(max_connections=64)
        )
        admin_sock = bind_listener(settings.admin_listen, settings.backlog, "admin address")
        await admin_server.start(admin_sock, settings.backlog)
        tls_address = None if tls_listen is None else split_address(tls_listen)
        bound(split_address(listen), tls_address, admin_sock.getsockname()[:2])
        try:
            async with anyio.create_task_group() as tasks:

                async def stop_when_told() -> None:
                    await wait_for_stop()
                    supervisor.stop()

                tasks.start_soon(stop_when_told)
                await supervisor.run()
                tasks.cancel_scope.cancel()
        finally:
            await admin_server.stop(0)
        return supervisor.failed
