"""The proxy service: route, take capacity, rewrite headers, retry, stream.

Theory of operation:
- A request takes a use of a cached lease, or a fresh lease from the activator (waiting,
  bounded, while nothing is routable) in `open`. Every use it took is handed back by
  `finish`, which never awaits, whatever ended the exchange: answer sent, upstream error,
  client gone, cancellation, timeout, shutdown.
- A request body is read up to `PREREAD_BYTES` before anything else (`preread`): a client
  trickling a small body in holds no capacity meanwhile.
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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Protocol

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
from wakeful.ingress.headers import client_response_headers, upstream_request_headers
from wakeful.ingress.load import WAIT, Tracker
from wakeful.ingress.metrics import IngressMetrics
from wakeful.ingress.retry import RESEND_PAUSE, Body, Next, next_attempt
from wakeful.ingress.routing import Route, Router, RoutingTable, normalize_host
from wakeful.ingress.settings import IngressSettings
from wakeful.ingress.streams import chunks
from wakeful.ingress.transport import Transport, UpstreamRequest, UpstreamResponse

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
        route = self._router.route(host_header)
        if route is None:
            raise NoRoute(normalize_host(host_header) or host_header)
        return route

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
        fresh = False
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
                    again=again,
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
                answer = client_response_headers(response.headers, request.request_id)
                if self._server_timing or lease.server_timing:
                    answer.append(
                        (b"server-timing", server_timing(queued, woke, upstream, woke_by))
                    )
                return ProxyResponse(response.status, answer, response, lease, woke_by)
            except BaseException:
                response.close()
                raise

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


def server_timing(queued: float, woke: float, upstream: float, woke_by: str = "") -> bytes:
    """The `Server-Timing` value of a proxied answer, in milliseconds: `queue` (waiting for a
    lease), `wake` (of which waiting for the app to wake; only when this request woke it; its
    `desc` says how: `thaw` of a suspended sandbox or `start` of a new one), `upstream` (the
    sandbox's time to the answer's head). Built of bytes: `wakeful up` sends it on every
    answer, and formatting three floats cost a third as much as the rest of the request's
    bookkeeping."""
    queue = _ms(queued)
    if not woke:  # most answers: two fields
        return b"queue;dur=" + queue + b", upstream;dur=" + _ms(upstream)
    wake = b"wake;dur=" + _ms(woke)
    if woke_by in ("thaw", "start"):
        wake += b';desc="' + woke_by.encode() + b'"'
    return b"queue;dur=" + queue + b", " + wake + b", upstream;dur=" + _ms(upstream)


def _tenths(tenths: int) -> bytes:
    return b"%d.%d" % (tenths // 10, tenths % 10)


_TENTHS: Final = tuple(_tenths(tenths) for tenths in range(1000))
"""`_ms`'s answers below 100 ms (most), made once."""


def _ms(seconds: float) -> bytes:
    """`seconds` (none below 0: a negative time is 0) in milliseconds to a tenth, rounded half
    up (`0.00025` is `0.3`)."""
    tenths = int(max(seconds, 0.0) * 10_000 + 0.5)
    if tenths < 1000:
        return _TENTHS[tenths]
    return _tenths(tenths)


PREREAD_BYTES: Final = 64 * 1024
"""A request body is read up to this much before the request takes a lease or an upstream
connection."""


async def preread(body: RequestBody, limit: int = PREREAD_BYTES) -> RequestBody:
    """Read `body` up to `limit` bytes now. A client that trickles a small body in then holds
    neither a lease (the sandbox's capacity) nor an upstream connection (its app's share) while
    it does, as nginx's request buffering; a body read whole can also be sent again when a
    sandbox refused the connection. A larger body streams on from where this stopped."""
    chunks: list[bytes] = []
    size = 0
    rest = body.stream().__aiter__()
    while size < limit:
        try:
            chunk = await anext(rest)
        except StopAsyncIteration:
            return _Preread(chunks, None, body)
        chunks.append(chunk)
        size += len(chunk)
    return _Preread(chunks, rest, body)


class _Preread:
    """A body read before the request was sent: what was read, then the rest as it comes."""

    __slots__ = ("_chunks", "_pulled", "_rest", "_source")

    def __init__(
        self, chunks: list[bytes], rest: AsyncIterator[bytes] | None, source: RequestBody
    ) -> None:
        self._chunks = chunks
        self._rest = rest
        self._source = source
        self._pulled = False

    @property
    def started(self) -> bool:
        """What was read before can be sent again; once the rest is being read, it cannot."""
        return self._pulled

    @property
    def client_gone(self) -> bool:
        return self._source.client_gone

    def stream(self) -> AsyncIterator[bytes]:
        """What was read, then the rest: from the start at each call (a retry sends it
        again)."""
        return chunks(_Replay(self).next_chunk)


class _Replay:
    """One pass over a `_Preread`."""

    __slots__ = ("_next", "_preread")

    def __init__(self, preread: _Preread) -> None:
        self._preread = preread
        self._next = 0

    async def next_chunk(self) -> bytes | None:
        preread = self._preread
        if self._next < len(preread._chunks):
            self._next += 1
            return preread._chunks[self._next - 1]
        if preread._rest is None:
            return None
        preread._pulled = True
        try:
            return await anext(preread._rest)
        except StopAsyncIteration:
            return None
