"""The proxy service: route, take capacity, rewrite headers, retry, stream.

Theory of operation:
- A request takes a use of a cached lease, or a fresh lease from the activator (waiting,
  bounded, while nothing is routable). Every use it took is handed back on the way out of
  `forward`, shielded, whatever ended it: answer sent, upstream error, client gone,
  cancellation, timeout, shutdown.
- A retry happens only on ConnectFailed (nothing reached the sandbox) and only when none of
  the request body was read. The refused sandbox's cached leases leave the cache; the use
  that failed is held until the request ends, so the activator sees that sandbox loaded
  and places the retry elsewhere.
- The sandbox URL always comes from a lease; the client supplies only the path and query.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from .cache import LeaseCache, Use
from .errors import BadRequest, ConnectFailed, NoRoute, UpstreamError, UpstreamTimeout
from .headers import client_response_headers, upstream_request_headers
from .metrics import IngressMetrics, Move, Tracker
from .routing import RoutingTable, match, normalize_host
from .settings import IngressSettings
from .transport import Transport, UpstreamRequest, UpstreamResponse


class RequestBody(Protocol):
    started: bool
    """Some of the body was read: the request can no longer be sent anywhere else."""
    client_gone: bool
    """The client hung up while sending it."""

    def stream(self) -> AsyncIterator[bytes]: ...


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    method: str
    target: str
    """Path and query exactly as received (`/a%20b?x=1`)."""
    headers: list[tuple[str, str]]
    client_ip: str
    scheme: str
    request_id: str
    body: RequestBody | None


@dataclass(frozen=True, slots=True)
class ProxyResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: AsyncIterator[bytes]


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

    def route(self, host_header: str) -> str:
        host = normalize_host(host_header)
        app = match(self._routes.index, host, self._settings.base_domain)
        if app is None:
            raise NoRoute(host or host_header)
        return app

    @contextlib.asynccontextmanager
    async def forward(
        self, app: str, request: ProxyRequest, tracker: Tracker
    ) -> AsyncIterator[ProxyResponse]:
        if not request.target.startswith("/"):
            raise BadRequest(f"request target {request.target[:80]!r} is not a path")
        headers = upstream_request_headers(
            request.headers,
            client_ip=request.client_ip,
            scheme=request.scheme,
            request_id=request.request_id,
            trust_forwarded=self._settings.trust_forwarded,
        )
        held: list[Use] = []
        try:
            response = await self._connect(app, request, headers, tracker, held)
            try:
                yield ProxyResponse(
                    response.status,
                    client_response_headers(response.headers, request.request_id),
                    self._counted(app, response),
                )
            finally:
                response.close()
        finally:
            for use in held:
                await self._cache.give_back(use)  # shielded inside

    async def _connect(
        self,
        app: str,
        request: ProxyRequest,
        headers: list[tuple[str, str]],
        tracker: Tracker,
        held: list[Use],
    ) -> UpstreamResponse:
        """Send to a sandbox, retrying elsewhere while nothing reached one; every use taken
        goes into `held` before anything can fail, so the caller gives it back."""
        key = (app, None)
        refused: set[str] = set()
        retries = 0
        while True:
            use = self._cache.take(key, refused)
            if use is None:
                tracker.move(Move.WAIT)
                use = await self._cache.acquire(key)
            held.append(use)
            tracker.move(Move.HOLD)
            try:
                if use.sandbox_id in refused:
                    raise ConnectFailed(f"sandbox {use.sandbox_id} refused this request already")
                return await self._transport.send(
                    UpstreamRequest(
                        request.method,
                        use.url + request.target,
                        headers,
                        request.body.stream() if request.body is not None else None,
                        self._settings.timeout_for(app),
                    )
                )
            except ConnectFailed:
                self._metrics.upstream_errors.labels(app=app, kind="connect").inc()
                refused.add(use.sandbox_id)
                for grant in self._cache.drop_sandbox(use.sandbox_id):
                    await self._cache.release(grant)
                body_read = request.body is not None and request.body.started
                if retries >= self._settings.connect_retries or body_read:
                    raise
                retries += 1
                self._metrics.connect_retries.labels(app=app).inc()
            except UpstreamError as exc:
                self._count_error(app, exc)
                raise

    async def _counted(self, app: str, response: UpstreamResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.body():
                yield chunk
        except UpstreamError as exc:
            self._count_error(app, exc)
            raise

    def _count_error(self, app: str, exc: UpstreamError) -> None:
        kind = "timeout" if isinstance(exc, UpstreamTimeout) else "failed"
        self._metrics.upstream_errors.labels(app=app, kind=kind).inc()
