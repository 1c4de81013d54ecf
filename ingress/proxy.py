"""The proxy service: route, take capacity, rewrite headers, retry, stream.

Theory of operation:
- A request takes a use of a cached lease, or a fresh lease from the activator (waiting,
  bounded, while nothing is routable) in `open`. Every use it took is handed back by
  `finish`, which never awaits, whatever ended the exchange: answer sent, upstream error,
  client gone, cancellation, timeout, shutdown.
- A request body is read up to `PREREAD_BYTES` before anything else (`ingress.preread`): a
  client trickling a small body in holds no capacity meanwhile.
- Whether a failed request is sent again, and where, is `retry.next_attempt`'s (invariant
  11); `open` carries it out. Sent elsewhere (nothing reached the sandbox): the refused
  sandbox's cached leases leave the cache, and the use that failed is held until the request
  ends, so the activator sees that sandbox loaded and places the retry elsewhere. Sent again
  (the connection closed unanswered): on the same use, on a fresh connection; or, when the
  connection that closed was new, after a pause on one the pool has idle by then (it holds
  one of the app's threads already) or a new one.
- The sandbox URL always comes from a lease; the client supplies only the path and query.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from wakeful.aio import trace
from wakeful.domain.leases import LeaseGrant
from wakeful.ingress import grpc
from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.cacherules import CachedLease, Use
from wakeful.ingress.errors import (
    ConnectFailed,
    NoRoute,
    UpstreamError,
    UpstreamTimeout,
)
from wakeful.ingress.headers import (
    client_response_headers,
    server_timing,
    upstream_request_headers,
)
from wakeful.ingress.load import WAIT, Tracker
from wakeful.ingress.metrics import IngressMetrics
from wakeful.ingress.preread import preread
from wakeful.ingress.retry import RESEND_PAUSE, Body, Next, next_attempt
from wakeful.ingress.routing import Route, Router, RoutingTable, normalize_host
from wakeful.ingress.settings import IngressSettings
from wakeful.ingress.transport import Transport, UpstreamRequest, UpstreamResponse

if TYPE_CHECKING:
    from wakeful.ingress.upstream.bases import Listener
    from wakeful.ingress.upstream.raw import Idle

# Bound once: compiled, `module.name` is a lookup on the module at every call.
_clock: Final = time.perf_counter


class RequestBody(Protocol):
    @property
    def started(self) -> bool:
        """Some of the body was read: the request can no longer be sent anywhere else."""
        ...

    @property
    def client_gone(self) -> bool:
        """The client hung up while sending it."""
        ...

    def stream(self) -> AsyncIterator[bytes]: ...


@dataclass(slots=True, init=False)
class ProxyRequest:
    method: str
    target: bytes
    """Path and query exactly as received (`/a%20b?x=1`)."""
    headers: list[tuple[bytes, bytes]]
    """Names lower-cased, values as received, in order."""
    client_ip: str
    scheme: str
    request_id: str
    body: RequestBody | None
    upgrade: bool = False
    """A WebSocket handshake (`ingress.websocket`)."""
    streaming: bool = False
    """A call that streams both ways (gRPC): its body is not read ahead (`preread`), and its
    silences and length are bounded as a WebSocket's (the app's idle timeout and maximum
    duration) rather than by the request timeout."""
    deadline: float | None = None
    """When a gRPC call's `grpc-timeout` runs out (`time.monotonic()`): the sandbox is told
    what is left of it."""
    resent: bool = False
    """It went out once already and its pooled connection closed unanswered (the direct
    path's keep-alive race, `ingress.direct`): its one resend (`retry.next_attempt`) goes now,
    on a fresh connection."""

    def __init__(  # written out: compiled, where a dataclass's own would be interpreted
        self,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        client_ip: str,
        scheme: str,
        request_id: str,
        body: RequestBody | None,
        upgrade: bool = False,
        streaming: bool = False,
        deadline: float | None = None,
        resent: bool = False,
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.client_ip = client_ip
        self.scheme = scheme
        self.request_id = request_id
        self.body = body
        self.upgrade = upgrade
        self.streaming = streaming
        self.deadline = deadline
        self.resent = resent


@dataclass(slots=True, init=False)
class ProxyResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    """As the client gets them (`client_response_headers`)."""
    upstream: UpstreamResponse
    """The sandbox's answer: its body, read with `next_nowait` and `next`, and its `splice`
    when it switched to WebSocket (101)."""
    lease: CachedLease
    """The lease it went through: its grant (sandbox, version), what the app asks of the log."""
    woke_by: str = ""
    """How the app woke for this request (`thaw`, `start`), or "" when it was awake."""

    def __init__(  # written out: compiled, where a dataclass's own would be interpreted
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        upstream: UpstreamResponse,
        lease: CachedLease,
        woke_by: str = "",
    ) -> None:
        self.status = status
        self.headers = headers
        self.upstream = upstream
        self.lease = lease
        self.woke_by = woke_by


class Proxy:
    def __init__(
        self,
        settings: IngressSettings,
        routes: RoutingTable,
        cache: LeaseCache,
        transport: Transport,
        metrics: IngressMetrics,
    ) -> None:
        self._settings = settings
        self._routes = routes
        self._cache = cache
        self._transport = transport
        self._metrics = metrics
        self._router = Router(lambda: routes.index, settings.base_domain)
        # What every request reads of the settings, read once: an attribute of the settings
        # (a pydantic model) costs a lookup through its `__getattr__` hook each time.
        self._trust_forwarded = settings.trust_forwarded
        self._server_timing = settings.server_timing
        self._retries = settings.connect_retries
        self._timeouts = dict(settings.request_timeouts)
        self._timeout = settings.request_timeout

    def route(self, host_header: str) -> Route:
        """The app serving a Host header, the version a tag, its split or its active version
        names, and whether its answers are counted per version; NoRoute when none does."""
        route = self.find_route(host_header)
        if route is None:
            raise NoRoute(normalize_host(host_header) or host_header)
        return route

    def find_route(self, host_header: str) -> Route | None:
        """`route`, or None when no app is served by `host_header`."""
        return self._router.route(host_header)

    async def open(
        self,
        app: str,
        request: ProxyRequest,
        tracker: Tracker,
        held: list[Use],
        version: str | None = None,
        reported: str | None = None,
    ) -> ProxyResponse:
        """Send the request to a sandbox, retrying elsewhere while nothing reached one, and
        return once the answer's head is in. Every use of a lease taken goes into `held`
        before anything can fail: the caller hands them back with `finish`, whatever ends
        the exchange."""
        if request.body is not None and not request.streaming:  # before any capacity is
            request.body = await preread(request.body)  # taken: see `preread`
        headers = upstream_request_headers(
            request.headers,
            client_ip=request.client_ip,
            scheme=request.scheme,
            request_id=request.request_id,
            trust_forwarded=self._trust_forwarded,
        )
        key = (app, version)
        # Looked up once: a request that takes a cached lease counts the hit, and every
        # request that reaches a sandbox its phases.
        counts = self._metrics.counts(app)
        idle = longest = None
        if request.streaming:
            idle, longest = self._settings.websocket_limits(app)
        refused: dict[str, str] = {}
        """Sandboxes nothing reached, with why: the answer names the first reason."""
        elsewhere = again = 0
        """Times sent to another sandbox, and once more to the same one (`next_attempt`)."""
        fresh = request.resent
        """The next send takes a new connection: a resend after the keep-alive race."""
        waited = False
        queued = woke = 0.0
        """Seconds spent waiting for leases, and of those, for the app to wake (`PHASES`)."""
        woke_by = ""
        """How it woke: `thaw` (a suspended sandbox) or `start`."""
        use: Use
        lease: CachedLease
        sent: float
        while True:
            if not again:  # a new sandbox: take a use of a lease on one
                found = self._cache.take(key, refused)
                if found is None:
                    tracker.move(WAIT)
                    asked = _clock()
                    found = await self._cache.acquire(key)
                    queued += _clock() - asked
                    if not found.hit:  # its own grant: the activator says if it woke the app
                        woke = max(woke, min(found.lease.grant.woke_after, queued))
                        woke_by = found.lease.grant.woke_by or woke_by
                    waited = True
                    trace.mark("leased", app)  # a miss: rare enough to pay for the call
                use = found
                if use.hit:  # a cached lease's: taken here, or by `acquire` when one had room
                    counts.hits += 1
                held.append(use)
                tracker.hold()
                lease = use.lease
                sent = _clock()
            if request.deadline is not None:
                headers = _with_timeout(headers, request.deadline - time.monotonic())
            try:
                if refused and lease.sandbox_id in refused:
                    raise ConnectFailed(
                        f"sandbox {lease.sandbox_id} refused this request already: "
                        f"{refused[lease.sandbox_id]}"
                    )
                response = await self._transport.send(
                    UpstreamRequest(
                        app,
                        request.method,
                        lease.url,
                        request.target,
                        headers,
                        request.body.stream() if request.body is not None else None,
                        self._timeouts.get(app, self._timeout),
                        request.upgrade,
                        fresh,
                        lease.h2c,
                        idle,
                        longest,
                    )
                )
            except asyncio.CancelledError:
                if request.deadline is not None and time.monotonic() >= request.deadline:
                    # The call's own deadline: no 5xx (`ProxyEdge.handle`), but its time
                    # counts, so a version that hangs shows in its p99.
                    counts.phases(queued, woke, _clock() - sent, reported)
                raise
            except UpstreamError as exc:
                if isinstance(exc, ConnectFailed):
                    self._metrics.upstream_errors.labels(app=app, kind="connect").inc()
                    refused.setdefault(use.sandbox_id, str(exc))
                    for freed in self._cache.drop_sandbox(use.sandbox_id):
                        await self._cache.release(freed)
                step = next_attempt(
                    exc,
                    method=request.method,
                    body=_body_state(request.body),
                    elsewhere=elsewhere,
                    again=again + request.resent,
                    bound=self._retries,
                )
                if step is Next.AGAIN or step is Next.AGAIN_LATER:
                    if step is Next.AGAIN_LATER:  # then a pooled connection, if one is idle
                        await asyncio.sleep(RESEND_PAUSE)
                    again += 1
                    fresh = step is Next.AGAIN
                    continue
                if step is Next.ELSEWHERE:
                    elsewhere += 1
                    again = 0
                    fresh = False
                    self._metrics.connect_retries.labels(app=app).inc()
                    continue
                if not isinstance(exc, ConnectFailed):
                    self.count_error(app, exc)
                raise
            upstream = _clock() - sent
            counts.phases(queued, woke, upstream, reported)
            if waited:
                trace.mark("answered", app)
            try:
                answer = self.answer_headers(
                    lease, response.headers, request.request_id, queued, woke, upstream, woke_by
                )
                return ProxyResponse(response.status, answer, response, lease, woke_by)
            except BaseException:
                response.close()
                raise

    def answer_headers(
        self,
        lease: CachedLease,
        raw: Sequence[tuple[bytes, bytes]],
        request_id: str,
        queued: float,
        woke: float,
        upstream: float,
        woke_by: str = "",
    ) -> list[tuple[bytes, bytes]]:
        """The answer's headers as the client gets them (`client_response_headers`), with
        `Server-Timing` when the ingress or the app asks for it."""
        answer = client_response_headers(raw, request_id)
        if self._server_timing or lease.server_timing:
            answer.append((b"server-timing", server_timing(queued, woke, upstream, woke_by)))
        return answer

    def take_direct(self, app: str, version: str | None) -> tuple[Use, Idle] | None:
        """For the direct path (`ingress.direct`): a use of a cached lease with room, and an
        idle pooled connection to its sandbox with one of the app's slots, all taken now;
        None, with nothing taken, when any would mean a wait (or the sandbox speaks h2c)."""
        use = self._cache.take((app, version))
        if use is None:
            return None
        lease = use.lease
        idle = None if lease.h2c else self._transport.take_idle(app, lease.url)
        if idle is None:
            self.release_soon(self.finish(None, [use]))
            return None
        return use, idle

    def send_direct(
        self,
        app: str,
        idle: Idle,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        client_ip: str,
        scheme: str,
        request_id: str,
        listener: Listener,
    ) -> None:
        """Send a request with no body on `idle` (`take_direct`), its headers rewritten as
        `open` does; what comes back is told to `listener`."""
        headers = upstream_request_headers(
            headers,
            client_ip=client_ip,
            scheme=scheme,
            request_id=request_id,
            trust_forwarded=self._trust_forwarded,
        )
        timeout = self._timeouts.get(app, self._timeout)
        self._transport.begin(idle, method, target, headers, timeout, listener)

    def count_phases(self, app: str, upstream: float, reported: str | None) -> None:
        """A direct exchange's phases: no wait for a lease, `upstream` to the answer's head."""
        self._metrics.counts(app).phases(0.0, 0.0, upstream, reported)

    def finished_direct(self, app: str, idle: Idle, use: Use, counted: bool) -> None:
        """A direct exchange is over: what `take_direct` took goes back (as `finish`).
        `counted`: it answered the request (a cache hit, on the direct path); not when the
        request goes on to the general path (its resend), which counts its own."""
        self._transport.finished(app, idle)
        self.release_soon(self.finish(None, [use]))
        if counted:
            counts = self._metrics.counts(app)
            counts.hits += 1
            counts.direct += 1

    def finish(self, response: ProxyResponse | None, held: list[Use]) -> list[LeaseGrant]:
        """The exchange is over: close the sandbox's answer (its connection is kept when it
        was read to the end) and hand back every use in `held`. Never awaits, so nothing can
        interrupt it; returns the leases that freed, which the caller gives to `release`."""
        if response is not None:
            response.upstream.close()
        freed = []
        for use in held:
            grant = self._cache.put(use)
            if grant is not None:
                freed.append(grant)
        return freed

    def release_soon(self, grants: list[LeaseGrant]) -> None:
        """Give freed leases back to the activator, in tasks of their own (shielded from
        cancellation; a closing cache waits for them)."""
        for grant in grants:
            self._cache.release_soon(grant)

    def count_error(self, app: str, exc: UpstreamError) -> None:
        kind = "timeout" if isinstance(exc, UpstreamTimeout) else "failed"
        self._metrics.upstream_errors.labels(app=app, kind=kind).inc()


def _with_timeout(headers: list[tuple[bytes, bytes]], left: float) -> list[tuple[bytes, bytes]]:
    """`headers` with `grpc-timeout` set to what is left of the call's deadline."""
    kept = [pair for pair in headers if pair[0] != b"grpc-timeout"]
    kept.append((b"grpc-timeout", grpc.timeout_value(left)))
    return kept


def _body_state(body: RequestBody | None) -> Body:
    if body is None:
        return Body.NONE
    return Body.SPENT if body.started else Body.KEPT
