from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator

from wakeful.domain.addresses import join_address as join_address
from wakeful.domain.addresses import split_address as split_address
from wakeful.store.settings import StoreSettings

MAX_WORKERS = 256
"""Ingress workers on one machine at most (`ingress_workers`)."""

Seconds = Annotated[float, Field(gt=0, le=30 * 86_400)]
"""A per-app override of a time setting."""


class IngressSettings(StoreSettings):
    listen: str = "127.0.0.1:8080"
    """host:port the proxy listens on (port 0 picks a free one)."""
    admin_listen: str = "127.0.0.1:8081"
    """host:port of /healthz, /readyz and /metrics; never served on the proxy port."""
    base_domain: str = "localhost"
    """`<app>.<base_domain>` routes to the app (so http://hello.localhost:8080/ works)."""
    lease_idle_ttl: float = Field(default=30.0, gt=0, le=3600)
    """A cached lease carrying no request for this long is handed back to the activator."""
    activity_report_interval: float = Field(default=2.0, gt=0, le=3600)
    """A cached lease that carried traffic is renewed at least this often, which is how the
    activator learns the sandbox is busy. Apps' scale_down_delay is at least 5 s, so 2 s
    leaves room for the activator's own write (at most every scale_down_delay / 3)."""
    maintenance_interval: float = Field(default=1.0, gt=0, le=60)
    """How often cached leases are checked for renewal and idleness."""
    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    request_timeout: float = Field(default=300.0, gt=0, le=86_400)
    """Seconds a sandbox may stay silent: before its answer starts, and between body reads."""
    request_timeouts: dict[str, Seconds] = Field(default_factory=dict)
    """Per-app overrides of `request_timeout`, by app name."""
    connect_retries: int = Field(default=2, ge=0, le=10)
    """Retries on another sandbox when nothing reached the first (connection refused)."""
    trust_forwarded: bool = False
    """Append to an incoming X-Forwarded-* chain (only behind a trusted load balancer)."""
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=1024 * 1024)
    """Request line plus headers past this many bytes are answered 431."""
    upstream_connections: int = Field(default=1024, ge=1, le=100_000)
    """Requests holding an upstream connection at once, over every app."""
    upstream_connections_per_app: int = Field(default=256, ge=1, le=100_000)
    """Requests of one app holding an upstream connection at once: one app's flood (or its
    long-lived streams) cannot take the connections every other app needs."""
    requests_per_client: int = Field(default=256, ge=1, le=1_000_000)
    """Requests of one client address under way at once, each HTTP/2 stream one (an open
    WebSocket not): past it, 429 + Retry-After. One client cannot hold the upstream
    connections every other client needs (`ingress.clients`); clients behind one NAT share
    it. With `trust_forwarded`, the client is the last X-Forwarded-For entry. Per process:
    with workers, each counts its own (as `upstream_connections`)."""
    direct_path: bool = True
    """Answer the commonest exchange in callbacks, without a task (`ingress.direct`): a
    request with no body, alone on its HTTP/1.x connection, with a cached lease that has room
    and an idle upstream connection. Off, every request goes the general path: the same
    answers at the general path's cost (to compare them, or should the direct path ever
    misbehave)."""
    upstream_wait: float = Field(default=5.0, ge=0, le=300)
    """Seconds a request waits for one of those connections before 503 + Retry-After."""
    upstream_keepalive: float = Field(default=4.0, gt=0, le=3600)
    """Idle upstream connections are closed after this many seconds: below the sandbox's own
    idle timeout (uvicorn's is 5 s), so a request is never written to a closing connection."""
    client_keepalive: float = Field(default=5.0, gt=0, le=3600)
    client_header_timeout: float = Field(default=10.0, gt=0, le=3600)
    """A client connection must complete each request head within this many seconds of
    opening or of its previous answer; otherwise it is closed (408 if a head had begun)."""
    client_timeout: float = Field(default=60.0, gt=0, le=86_400)
    """Seconds a client may stay silent while sending its body, or not read while its answer
    is written, before the request ends (408 / the connection is cut) and its lease goes
    back (nginx's client_body_timeout and send_timeout)."""
    max_client_connections: int = Field(default=10_000, ge=1, le=1_000_000)
    """Client connections open at once; a new one past it is answered 503 and closed, those
    already open keep working. The process's open-file limit is raised to its hard limit."""
    shutdown_timeout: float = Field(default=30.0, ge=0, le=3600)
    """On SIGTERM, in-flight requests get this long to finish before they are cancelled."""
    show_boot_log: bool = False
    """Put a crash-looping app's last log lines in its 503 answer, but only while `listen` is
    a loopback address (see `boot_log_shown`). Off by default: the log can hold secrets, and
    the answer goes to anyone who can connect. `wakeful up` turns it on."""
    access_log: bool = False
    """WAKEFUL_ACCESS_LOG: an access line for every proxied request of every app, shipped to
    the control plane's log (`wakeful logs APP --access`); without it, only the requests of
    apps with `access_log = true`. `wakeful up` turns it on."""
    access_log_rate: int = Field(default=1000, ge=1, le=1_000_000)
    """WAKEFUL_ACCESS_LOG_RATE: access lines this ingress keeps per second before it samples
    (each kept line then says how many requests it stands for); with workers, each keeps its
    share (`ingress.workers.worker_env`), so the log's volume does not grow with them."""
    traffic_report_interval: float = Field(default=2.0, gt=0, le=60)
    """Seconds between the reports of what this ingress answered per app to the activator
    (the dashboard's charts)."""
    server_timing: bool = False
    """Every app's answers carry `Server-Timing` (queue, wake, upstream), not only those of
    apps that ask for it (`server_timing = true` in wakeful.toml). It tells anyone whether an
    app was asleep: off by default; `wakeful up`, which is for development, turns it on."""
    backlog: int = Field(default=2048, ge=1, le=65_535)
    ingress_workers: int | Literal["auto"] = 1
    """WAKEFUL_INGRESS_WORKERS (`wakeful ingress --workers`): ingress processes sharing the
    client port, each a replica of its own (`ingress.workers`); "auto", one per core this
    process may run on."""
    ingress_worker: int | None = Field(default=None, ge=0, le=MAX_WORKERS - 1)
    """Set by the workers' supervisor, not by hand: this process is worker N, so its client
    listeners share their port (SO_REUSEPORT)."""
    http2: bool = True
    """Serve HTTP/2 beside HTTP/1.1 (`ingress.http2`): on the TLS listener to clients whose
    ALPN picks `h2`, and on the plain listener to clients that open with the HTTP/2 preface
    (h2c with prior knowledge, as gRPC clients on a private network do). HTTP/1.1 clients
    pay one look at their first bytes."""

    tls_listen: str | None = None
    """host:port of an HTTPS listener beside `listen`: certificates from `tls_dir` and from
    ACME (`WAKEFUL_ACME_EMAIL` on the control plane)."""
    tls_dir: Path | None = None
    """PEM pairs by host: `HOST.crt` + `HOST.key`, `*.DOMAIN.crt` for a wildcard, and the
    required `default.crt` + `default.key` (see `ingress.tls`); reloaded when they change.
    Optional with ACME: without it, a name with no certificate from ACME gets none."""
    tls_reload_interval: float = Field(default=5.0, gt=0, le=3600)
    """How often `tls_dir` is checked for changed files."""
    tls_redirect: list[str] = Field(default_factory=list)
    """Apps (by name; "*" for all) whose plain HTTP requests get a 308 to HTTPS."""
    websocket_idle_timeout: float = Field(default=600.0, gt=0, le=7 * 86_400)
    """A WebSocket across which nothing passed either way for this long is closed."""
    websocket_idle_timeouts: dict[str, Seconds] = Field(default_factory=dict)
    """Per-app overrides of `websocket_idle_timeout`, by app name."""
    websocket_max_duration: float = Field(default=86_400.0, gt=0, le=30 * 86_400)
    """A WebSocket is closed once it has been open this long, busy or not (its app can then
    scale down, deploy, drain: a client reconnects)."""
    websocket_max_durations: dict[str, Seconds] = Field(default_factory=dict)
    """Per-app overrides of `websocket_max_duration`, by app name."""

    tunnel_listen: str | None = None
    """host:port of the listener where dial-out nodes open their tunnel streams (WebSockets,
    behind a load balancer: nginx `proxy_pass` with the upgrade headers), and where the other
    replicas relay to this one (ingress.nodestreams). Off by default. WAKEFUL_TUNNEL_LISTEN."""
    tunnel_advertise: str | None = None
    """host:port the other replicas dial to relay here (default: `tunnel_listen`, with this
    machine's name when it listens on every address). WAKEFUL_TUNNEL_ADVERTISE."""
    tunnel_replica: str | None = None
    """This replica's name in `ingresses/` and in the nodes' coverage tables (default:
    `HOSTNAME-PORT`). WAKEFUL_TUNNEL_REPLICA."""
    tunnel_record_ttl: int = Field(default=10, ge=2, le=300)
    """Seconds this replica's `ingresses/` record outlives it when it dies unannounced (the
    peers relay to it no more), and how long a replica of the same name starting elsewhere
    waits for it, with a margin, before it is refused. WAKEFUL_TUNNEL_RECORD_TTL."""
    tunnel_streams_per_node: int = Field(default=1024, ge=1, le=65_536)
    """Streams one node may hold on this replica (seed 003); one past it is refused."""
    tunnel_wait: float = Field(default=30.0, gt=0, le=300)
    """Seconds a request waits for one of its node's busy streams here to free (a burst
    waits while the node grows its streams: doubling each second, 1,000 in about 8 s)."""

    @field_validator("listen", "admin_listen", "tls_listen", "tunnel_listen")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                split_address(value)
            except ValueError:
                raise ValueError("expected host:port") from None  # the value comes after
        return value

    @field_validator("ingress_workers", mode="before")
    @classmethod
    def _workers(cls, value: object) -> object:
        if value == "auto":
            return value
        try:
            count = int(str(value).strip())
        except ValueError:
            count = 0
        if not 1 <= count <= MAX_WORKERS:
            raise ValueError(f"must be 1 to {MAX_WORKERS} or 'auto'")
        return count

    @model_validator(mode="after")
    def _tls(self) -> Self:
        if self.tls_listen is not None:
            split_address(self.tls_listen)
        if self.tunnel_listen is not None:
            split_address(self.tunnel_listen)
        if self.tunnel_advertise is not None:
            split_address(self.tunnel_advertise)
        if self.tls_redirect and self.tls_listen is None:
            raise ValueError("tls_redirect needs tls_listen: there is no HTTPS to send to")
        return self

    def listening(self, listen: str, tls_listen: str | None) -> str:
        """The line an ingress announces once it serves (`listen` and `tls_listen` as bound)."""
        https = "" if tls_listen is None else f" and https://{tls_listen}"
        return f"ingress listening on http://{listen}{https}"

    @property
    def workers(self) -> int:
        """How many worker processes `ingress_workers` asks for ("auto": one per usable core)."""
        if self.ingress_workers == "auto":
            return min(MAX_WORKERS, len(os.sched_getaffinity(0)))
        return self.ingress_workers

    def redirects_to_https(self, app: str) -> bool:
        return bool(self.tls_redirect) and ("*" in self.tls_redirect or app in self.tls_redirect)

    def websocket_limits(self, app: str) -> tuple[float, float]:
        """The app's WebSocket idle timeout and maximum duration, in seconds."""
        return (
            self.websocket_idle_timeouts.get(app, self.websocket_idle_timeout),
            self.websocket_max_durations.get(app, self.websocket_max_duration),
        )

    @property
    def boot_log_shown(self) -> bool:
        """Whether 503 answers carry boot logs: asked for, and only this machine can connect."""
        return self.show_boot_log and listens_on_loopback(self.listen)


def listens_on_loopback(address: str) -> bool:
    """Whether a listener on `host:port` takes connections only from this machine: a host in
    127.0.0.0/8, ::1 (or ::ffff:127.x), or `localhost`. A wildcard (0.0.0.0, ::), any other
    address, any other name, or an address that does not parse counts as public."""
    try:
        host, _ = split_address(address)
    except ValueError:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
