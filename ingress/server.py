"""The ingress as a running service: one place where its pieces are wired and stopped.

Shutdown runs in a fixed order: fail readiness, stop accepting (the listener closes; idle
keep-alive connections close), let in-flight requests finish within `shutdown_timeout`,
cancel what is left (their uses are given back, shielded), release every cached lease, stop
the admin server, close the upstream session.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import resource
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Gauge
from websockets.asyncio.server import Server as WebSocketServer

from wakeful.domain import keys
from wakeful.domain.leases import Leases
from wakeful.domain.models import AcmeChallenge, CertRecord
from wakeful.ingress.accesslog import AccessLog
from wakeful.ingress.acme import CertSource, Challenges, IssuedFeed, ServedPair
from wakeful.ingress.admin import AdminEdge
from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.clients import ClientShares
from wakeful.ingress.edge import ProxyEdge
from wakeful.ingress.http1 import HttpServer, Limits
from wakeful.ingress.metrics import IngressMetrics
from wakeful.ingress.nodestreams import Tunnels, default_replica_name
from wakeful.ingress.ports import bind_listener
from wakeful.ingress.proxy import Proxy
from wakeful.ingress.routing import RoutingTable, normalize_host
from wakeful.ingress.sandboxes import follow_sandboxes
from wakeful.ingress.settings import IngressSettings, join_address, split_address
from wakeful.ingress.tls import Certificates, TLSConfigError
from wakeful.ingress.transport import Transport
from wakeful.ingress.upstream import RawTransport
from wakeful.store import Store
from wakeful.store.reflector import reflect

log = logging.getLogger(__name__)


def raise_open_files_limit() -> None:
    """Open files up to the hard limit: each client and upstream connection is one, and the
    soft limit (often 1024) would refuse connections long before `max_client_connections`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Ingress:
    def __init__(
        self,
        settings: IngressSettings,
        leases: Leases,
        store: Store,
        registry: CollectorRegistry,
        *,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
        relay_token: str | None = None,
        certs: CertSource | None = None,
    ) -> None:
        """`certs`: where certificates from ACME and their keys come from (the control
        plane). `clock`: the lease cache's time (renewals, idle hand-back); tests move it by hand.
        `relay_token`: the ingress token this replica relays to its peers with (tunnels)."""
        self.settings = settings
        self.metrics = IngressMetrics(registry)
        self.clients = ClientShares(settings.requests_per_client)
        """Each client's requests under way (`ingress.clients`)."""
        self.routes = RoutingTable(store)
        Gauge(
            "wakeful_ingress_routes_revision",
            "The store revision this ingress's routes have followed apps/ to.",
            registry=registry,
        ).set_function(lambda: self.routes.revision)
        self._store = store
        self.cache = LeaseCache(
            leases,
            idle_ttl=settings.lease_idle_ttl,
            report_every=settings.activity_report_interval,
            on_miss=self.metrics.cache_miss,
            clock=clock,
        )
        self._registry = registry
        self._leases = leases
        self.access = AccessLog(settings.access_log, settings.access_log_rate, registry)
        self.name = settings.tunnel_replica or ""
        """This ingress in its access lines: its replica name, once it listens."""
        self._transport = transport
        self.transport: Transport | None = None
        """The upstream transport while running (the one given, or a RawTransport)."""
        self._draining = False
        self.address: tuple[str, int] = ("", 0)
        """Where the proxy listens, once running (the port is real even when 0 was asked)."""
        self.admin_address: tuple[str, int] = ("", 0)
        self.tls_address: tuple[str, int] = ("", 0)
        """Where the HTTPS listener is, when there is one (`tls_listen`)."""
        self.certificates: Certificates | None = None
        self._relay_token = relay_token
        self._certs = certs
        self.issued: IssuedFeed | None = None
        self.challenges = Challenges(store)
        """ACME's HTTP-01 challenges, answered on the plain listener before routing."""
        self.tunnels: Tunnels | None = None
        """Dial-out nodes' streams on this replica, when it listens for them."""
        self.tunnel_address: tuple[str, int] = ("", 0)

    @property
    def ready(self) -> bool:
        # Refused its token, every request would get 503: out of a balancer's rotation.
        refused = self._leases.refused is not None
        return self.routes.synced.is_set() and not self._draining and not refused

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Ingress]:
        """Serve until the block exits, then shut down in order (see the module docstring)."""
        raise_open_files_limit()
        async with contextlib.AsyncExitStack() as stack:
            tasks = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tasks.cancel_scope.cancel)  # runs before the group waits
            if self.settings.tunnel_listen is not None:
                await self._serve_tunnels(stack, tasks)
            transport = self._transport
            if transport is None:
                transport = await stack.enter_async_context(
                    RawTransport(
                        connect_timeout=self.settings.connect_timeout,
                        keepalive=self.settings.upstream_keepalive,
                        per_app=self.settings.upstream_connections_per_app,
                        total=self.settings.upstream_connections,
                        wait=self.settings.upstream_wait,
                        dialer=None if self.tunnels is None else self.tunnels.dial,
                    )
                )
            self.transport = transport
            proxy = Proxy(self.settings, self.routes, self.cache, transport, self.metrics)
            tasks.start_soon(self.routes.run)
            tasks.start_soon(self.cache.run, self.settings.maintenance_interval)
            tasks.start_soon(follow_sandboxes, self._store, self.cache)
            tasks.start_soon(self._report_traffic)
            mirror = functools.partial(reflect, what="ACME challenges")
            tasks.start_soon(mirror, self._store, keys.CHALLENGES, AcmeChallenge, self.challenges)
            with anyio.fail_after(60):
                await self.routes.synced.wait()
            limits = Limits(
                max_head_bytes=self.settings.max_header_bytes,
                head_timeout=self.settings.client_header_timeout,
                keepalive=self.settings.client_keepalive,
                max_connections=self.settings.max_client_connections,
                client_timeout=self.settings.client_timeout,
            )
            admin = HttpServer(AdminEdge(self._registry, lambda: self.ready), limits)
            admin_sock = self._bind(self.settings.admin_listen, "admin address")
            await _start(admin, admin_sock, self.settings.backlog)
            self.admin_address = admin_sock.getsockname()[:2]
            if self.settings.show_boot_log and not self.settings.boot_log_shown:
                log.warning(
                    "boot logs stay out of 503 answers: the ingress listens on %s, not on "
                    "loopback (`wakeful logs` shows them)",
                    self.settings.listen,
                )
            if (  # said once: by the first worker of several
                self.settings.tls_dir is not None
                and self.settings.tls_listen is None
                and not self.settings.ingress_worker
            ):
                log.warning(
                    "WAKEFUL_TLS_DIR is set and WAKEFUL_TLS_LISTEN is not: there is no HTTPS "
                    "listener, and the certificates in %s serve nothing",
                    self.settings.tls_dir,
                )
            edge = ProxyEdge(
                proxy,
                self.metrics,
                self.settings.max_header_bytes,
                self.settings.boot_log_shown,
                self.settings.websocket_limits,
                self._https_location if self.settings.tls_redirect else None,
                self.challenges.answer,
                self.access,
                self.clients,
                self.settings.trust_forwarded,
                self.settings.direct_path,
            )
            cut_off = self._http2_cut_off
            refused = self._refused
            server = HttpServer(
                edge, limits, http2=self.settings.http2, cut_off=cut_off, refused=refused
            )
            sock = self._bind(self.settings.listen, "listen address")
            try:
                await _start(server, sock, self.settings.backlog)
            except BaseException:
                await admin.stop(0)
                raise
            self.address = sock.getsockname()[:2]
            self.name = self.name or default_replica_name("{}:{}".format(*self.address))
            log.info("ingress listening on %s:%d", *self.address)
            tasks.start_soon(self._report_routes)
            servers = [server]
            try:
                if self.settings.tls_listen is not None:
                    servers.append(await self._serve_tls(edge, limits, tasks))
                self.metrics.http2_open.set_function(lambda: sum(len(s.h2) for s in servers))
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    self._draining = True
                    with contextlib.suppress(Exception):  # as `_report_routes` says why
                        self._leases.routes(self.name, None)  # a deploy waits for it no more
                    async with anyio.create_task_group() as stopping:
                        for each in servers:
                            stopping.start_soon(each.stop, self.settings.shutdown_timeout)
                    try:  # the last requests' lines, before the channel goes
                        self._ship_access()
                    except Exception:
                        log.exception("could not ship the last access lines")
                    await self.cache.close()
                    await admin.stop(0)
                    log.info("ingress stopped")

    def _bind(self, address: str, what: str) -> socket.socket:
        """A listener; shared with the other workers when this is one (the tunnel listener
        never is: peers relay to one replica, `ingress.workers`)."""
        shared = self.settings.ingress_worker is not None
        return bind_listener(address, self.settings.backlog, what, shared)

    async def _report_traffic(self) -> None:
        """What this ingress answered per app, to the activator every `traffic_report_interval`
        (beside the lease renewals): the dashboard's charts of every ingress together; and
        its access lines since (`ingress.accesslog`)."""
        while True:
            await anyio.sleep(self.settings.traffic_report_interval)
            try:
                self._leases.report(self.metrics.traffic_since_last())
                self._ship_access()
            except Exception:  # the charts and the log are never worth the ingress
                log.exception("could not report traffic to the activator")

    async def _report_routes(self) -> None:
        """The revision this ingress's routes have followed, to the activator as it moves
        (`Leases.routes`): a deploy waits until every ingress routes what it wrote."""
        while not self._draining:
            try:
                self._leases.routes(self.name, self.routes.revision)
            except Exception:  # a `Leases` of a program's own, older than the method
                log.exception("could not tell the activator how far the routes have come")
                return
            await self.routes.changed()

    def _ship_access(self) -> None:
        lines = self.access.take()
        if lines and not self._leases.access(self.name, lines):
            self.access.keep(lines)  # no channel now: with the next report

    async def _serve_tunnels(
        self, stack: contextlib.AsyncExitStack, tasks: anyio.abc.TaskGroup
    ) -> None:
        """The WebSocket listener for dial-out nodes' streams and peers' relays
        (`ingress.nodestreams`), stopped after the proxy's listeners."""
        listen = self.settings.tunnel_listen
        assert listen is not None
        sock = bind_listener(listen, self.settings.backlog, "tunnel listen address")
        host, port = sock.getsockname()[:2]
        self.tunnel_address = (host, port)
        advertise = self.settings.tunnel_advertise
        if advertise is None:
            shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
            advertise = join_address(shown, port)
        replica = self.settings.tunnel_replica or default_replica_name(f"{host}:{port}")
        self.tunnels = Tunnels(
            self._store,
            replica=replica,
            advertise=advertise,
            per_node=self.settings.tunnel_streams_per_node,
            wait=self.settings.tunnel_wait,
            ingress_token=self._relay_token,
            registry=self._registry,
            record_ttl=self.settings.tunnel_record_ttl,
        )
        try:
            await self.tunnels.claim()  # no twin of this name runs: before anything is served
        except BaseException:
            sock.close()
            raise
        tasks.start_soon(self.tunnels.run)
        try:
            server = await self.tunnels.serve(sock)
        except BaseException:
            sock.close()
            raise
        stack.push_async_callback(_stop_tunnels, server)
        log.info("ingress replica %s takes tunnels on %s:%d", replica, host, port)

    def _http2_cut_off(self, reason: str) -> None:
        self.metrics.http2_cut_off.labels(reason=reason).inc()

    def _refused(self, reason: str) -> None:
        self.metrics.refused.labels(reason=reason).inc()

    def _https_location(self, app: str, host_header: str, target: bytes) -> str | None:
        """Where a plain HTTP request of `app` is sent instead, if its app asks for HTTPS."""
        if not self.settings.redirects_to_https(app) or not self.tls_address[1]:
            return None
        assert self.settings.tls_listen is not None
        port = split_address(self.settings.tls_listen)[1] or self.tls_address[1]
        host = normalize_host(host_header)
        return f"https://{host}{'' if port == 443 else f':{port}'}{target.decode('latin-1')}"

    async def _serve_tls(
        self, edge: ProxyEdge, limits: Limits, tasks: anyio.abc.TaskGroup
    ) -> HttpServer:
        """The HTTPS listener (`ingress.tls`): the same edge, certificates by SNI, reloaded by
        a task of `tasks`, and those from ACME as they are issued (`ingress.acme`). A
        directory that cannot serve is an OSError naming it."""
        listen, directory = self.settings.tls_listen, self.settings.tls_dir
        assert listen is not None  # the settings check it
        try:
            certificates = await anyio.to_thread.run_sync(
                Certificates, directory, self.settings.http2
            )
        except TLSConfigError as exc:
            raise OSError(errno.EINVAL, f"cannot serve TLS: {exc}", str(directory)) from exc
        self.certificates = certificates
        if self._certs is not None:

            async def install(pairs: list[ServedPair]) -> None:
                await certificates.install_issued(
                    [(p.name, p.chain, p.key, p.serial) for p in pairs]
                )

            self.issued = IssuedFeed(self._certs, install)
            mirror = functools.partial(reflect, what="certificates")
            tasks.start_soon(mirror, self._store, keys.CERTS, CertRecord, self.issued)
            tasks.start_soon(self.issued.run)
        elif directory is None:
            log.warning(
                "the TLS listener has no WAKEFUL_TLS_DIR and no certificates from ACME: "
                "every handshake fails"
            )
        server = HttpServer(
            edge,
            limits,
            certificates.context,
            self.settings.http2,
            self._http2_cut_off,
            self._refused,
        )
        sock = self._bind(listen, "TLS listen address")
        await _start(server, sock, self.settings.backlog)
        self.tls_address = sock.getsockname()[:2]
        tasks.start_soon(self.certificates.watch, self.settings.tls_reload_interval)
        log.info("ingress listening on %s:%d (TLS)", *self.tls_address)
        return server


async def _stop_tunnels(server: WebSocketServer) -> None:
    """Close the tunnel listener and every stream on it (their nodes reconnect elsewhere)."""
    with anyio.CancelScope(shield=True):
        server.close()
        with anyio.move_on_after(5):
            await server.wait_closed()


async def _start(server: HttpServer, sock: socket.socket, backlog: int) -> None:
    try:
        await server.start(sock, backlog)
    except BaseException:
        sock.close()
        raise


async def serve(
    settings: IngressSettings,
    leases: Leases,
    store: Store,
    registry: CollectorRegistry,
    *,
    wait_for_stop: Callable[[], Awaitable[int]],
    relay_token: str | None = None,
    certs: CertSource | None = None,
    ready: Callable[[], None] = lambda: None,
    before: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run the ingress until `wait_for_stop` returns (the process's signal receiver,
    `wakeful.process.wait_for_signal`: SIGTERM or SIGINT), then shut it down gracefully.
    `before`: what must pass before it starts (the token's check). `ready`: called once it
    listens (what announces it: a line said before would send a script that waits for it to
    a port nobody listens on yet).

    A stop before its client listener takes connections (the check, the wait for its replica
    name, the routes' first sync) ends the start at once: no request was taken, so none is
    drained. A stop once it does (the HTTPS listener may still be starting) lets the start
    finish and drains in order (`Ingress.running`); a second stop meanwhile does not cut the
    drain short, which `WAKEFUL_SHUTDOWN_TIMEOUT` bounds.

    Run it on uvloop: `anyio.run(serve, ..., backend_options={"use_uvloop": True})`.
    """
    ingress = Ingress(settings, leases, store, registry, relay_token=relay_token, certs=certs)
    stop = anyio.Event()

    async def run() -> None:
        if before is not None:
            await before()
        async with ingress.running():
            if not stop.is_set():
                ready()
            await stop.wait()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        signum = await wait_for_stop()
        log.info("received %s; shutting down", signal.Signals(signum).name if signum else "a stop")
        if ingress.address[1]:  # its client listener takes connections: drained
            stop.set()
        else:
            tasks.cancel_scope.cancel()
