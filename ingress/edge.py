"""The ASGI edge: plain ASGI callables, no framework on the proxy path.

`ProxyApp` turns an ASGI request into a `ProxyRequest`, streams the answer back, and is the
only place our exceptions become status codes (`answer_for`). A request that runs
a while gets a watcher on `receive()`, so a client hanging up mid-response cancels the
exchange (uvicorn's `send` goes quiet after a disconnect instead of raising).
`AdminApp` serves /healthz, /readyz and /metrics on its own port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from wakeful.domain.leases import ActivatorError, AppFailedToBoot, Unavailable, UnknownApp
from wakeful.ingress.errors import (
    ActivatorUnreachable,
    BadRequest,
    ClientGone,
    ClientTooSlow,
    HeadersTooLarge,
    IngressError,
    NoRoute,
    UpstreamBusy,
    UpstreamError,
    UpstreamTimeout,
)
from wakeful.ingress.formats import ErrorAnswer, choose_format, render
from wakeful.ingress.headers import new_request_id, read_request_head
from wakeful.ingress.metrics import IngressMetrics, Move, Tracker
from wakeful.ingress.proxy import Proxy, ProxyRequest

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
CLIENT_GONE = 499
"""nginx's code for a client that left before its answer: logged and counted, never sent."""


def answer_for(exc: Exception, show_boot_log: bool = False) -> ErrorAnswer:
    """The status and shape of an error answer, for errors raised before the answer started.

    An app's boot log goes to anonymous clients only when `show_boot_log` says so: it can hold
    configuration, paths and secrets. Operators read it with `wakeful logs`.
    """
    if isinstance(exc, NoRoute):
        return ErrorAnswer(404, "unknown host", str(exc))
    if isinstance(exc, UnknownApp):
        return ErrorAnswer(404, "unknown app", str(exc))
    if isinstance(exc, ClientTooSlow):
        return ErrorAnswer(408, "request timeout", str(exc))
    if isinstance(exc, HeadersTooLarge):
        return ErrorAnswer(431, "request header fields too large", str(exc))
    if isinstance(exc, BadRequest):
        return ErrorAnswer(400, "bad request", str(exc))
    if isinstance(exc, AppFailedToBoot):
        log_lines = exc.log if show_boot_log else None
        return ErrorAnswer(503, "app failed to boot", str(exc), exc.retry_after, log_lines)
    if isinstance(exc, Unavailable):
        return ErrorAnswer(503, "no capacity", str(exc), exc.retry_after)
    if isinstance(exc, UpstreamBusy):
        return ErrorAnswer(503, "upstream busy", str(exc), exc.retry_after)
    if isinstance(exc, ActivatorUnreachable | ActivatorError):
        return ErrorAnswer(503, "activator unavailable", str(exc), 5)
    if isinstance(exc, UpstreamTimeout):
        return ErrorAnswer(504, "upstream timed out", str(exc))
    if isinstance(exc, UpstreamError):
        return ErrorAnswer(502, "upstream failed", str(exc))
    return ErrorAnswer(500, "internal error", f"{type(exc).__name__}: {exc}")


class _Body:
    """The request body as the transport pulls it: straight from `receive`, nothing kept. A
    client silent for `timeout` seconds mid-body ends the request (ClientTooSlow, 408)."""

    __slots__ = ("_receive", "_timeout", "client_gone", "finished", "started")

    def __init__(self, receive: Receive, timeout: float) -> None:
        self._receive = receive
        self._timeout = timeout
        self.started = False
        self.client_gone = False
        self.finished = anyio.Event()

    async def stream(self) -> AsyncIterator[bytes]:
        self.started = True
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    message = await self._receive()
            except TimeoutError:
                raise ClientTooSlow(
                    f"the client sent none of its body for {self._timeout:g} s"
                ) from None
            if message["type"] == "http.disconnect":
                self.client_gone = True
                raise ClientGone("the client hung up while sending its body")
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                self.finished.set()
                return


@dataclass(slots=True)
class _Exchange:
    status: int = 500
    started: bool = False
    """The answer's head went out: an error now can only cut the connection."""
    answered: bool = False
    """The final body message went out: a disconnect seen now is the normal end."""
    client_gone: bool = False


class _DisconnectWatch:
    """Cancels the exchange when the client disconnects.

    A task reading `receive()` for every request costs a quarter of the proxy's throughput,
    and a request answered within WATCH_AFTER has nothing worth cancelling; so the watcher
    starts only once an exchange has run that long (a slow answer, a long body, a wait
    for capacity). It reads `receive` only after the request body is in: one reader at a
    time. `stop()` always cancels and awaits it: it never outlives its request.
    """

    WATCH_AFTER = 0.2

    def __init__(
        self, receive: Receive, body: _Body | None, scope: anyio.CancelScope, exchange: _Exchange
    ) -> None:
        self._receive = receive
        self._body = body
        self._scope = scope
        self._exchange = exchange
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(self.WATCH_AFTER, self._start)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        if self._body is not None:
            await self._body.finished.wait()
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if not self._exchange.answered:
                    self._exchange.client_gone = True
                    self._scope.cancel()
                return

    async def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([self._task])


class ProxyApp:
    def __init__(
        self,
        proxy: Proxy,
        metrics: IngressMetrics,
        max_header_bytes: int,
        show_boot_log: bool = False,
        client_timeout: float = 60.0,
    ) -> None:
        self._proxy = proxy
        self._client_timeout = client_timeout
        self._metrics = metrics
        self._max_header_bytes = max_header_bytes
        self._show_boot_log = show_boot_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":  # the server runs with lifespan off; be polite anyway
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        head = read_request_head(scope["headers"])
        headers = head.headers
        request_id = head.client_request_id or new_request_id()
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        query: bytes = scope.get("query_string", b"")
        target = (raw_path + b"?" + query if query else raw_path).decode("latin-1")
        label = "-"
        exchange = _Exchange()
        try:
            if head.hosts > 1:
                raise BadRequest(f"{head.hosts} Host headers: a request has exactly one")
            if len(target) + head.size > self._max_header_bytes:
                raise HeadersTooLarge(
                    f"request line and headers exceed {self._max_header_bytes} bytes"
                )
            app = self._proxy.route(head.host)
            label = app
            client = scope.get("client")
            body = _Body(receive, self._client_timeout) if head.has_body else None
            request = ProxyRequest(
                scope["method"],
                target,
                headers,
                client[0] if client else "",
                scope.get("scheme", "http"),
                request_id,
                body,
            )
            tracker = self._metrics.tracker(app)
            try:
                with anyio.CancelScope() as cancel:
                    watch = _DisconnectWatch(receive, body, cancel, exchange)
                    try:
                        await self._exchange(app, request, tracker, send, exchange)
                    finally:
                        await watch.stop()
            finally:
                tracker.move(Move.FINISH)
            if body is not None and body.client_gone:
                exchange.client_gone = True
        except (IngressError, ActivatorError) as exc:
            await self._answer_error(exc, headers, request_id, send, exchange)
        finally:
            status = CLIENT_GONE if exchange.client_gone else exchange.status
            self._metrics.answered(label, status, time.perf_counter() - started)

    async def _exchange(
        self, app: str, request: ProxyRequest, tracker: Tracker, send: Send, exchange: _Exchange
    ) -> None:
        """Forward and stream the answer back. Errors before the answer starts become an
        error answer; after, the client connection is cut (its body is incomplete)."""
        try:
            async with self._proxy.forward(app, request, tracker) as response:
                exchange.status = response.status
                exchange.started = True
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": response.headers,
                    }
                )
                # One chunk is held back so the last goes out with more_body=False: a small
                # answer costs one body message instead of two.
                held = b""
                try:
                    async for chunk in response.body:
                        if held:
                            # A client that stops reading blocks this send: bounded, so it
                            # cannot hold the sandbox's capacity for ever.
                            async with asyncio.timeout(self._client_timeout):
                                await send(
                                    {"type": "http.response.body", "body": held, "more_body": True}
                                )
                        held = chunk
                except UpstreamError as exc:
                    log.warning(
                        "upstream broke mid-answer; cutting the client off: %s",
                        exc,
                        extra={"app": app, "request_id": request.request_id},
                    )
                    exchange.status = 502
                    return  # uvicorn closes a connection whose answer was not completed
                except TimeoutError:
                    self._too_slow(app, request, exchange)
                    return
                exchange.answered = True
                try:
                    async with asyncio.timeout(self._client_timeout):
                        await send({"type": "http.response.body", "body": held, "more_body": False})
                except TimeoutError:
                    self._too_slow(app, request, exchange)
        except (IngressError, ActivatorError) as exc:
            gone = request.body is not None and request.body.client_gone
            if gone or exchange.started:
                log.warning("request ended without an answer: %s", exc, extra={"app": app})
                return
            await self._answer_error(exc, request.headers, request.request_id, send, exchange)

    def _too_slow(self, app: str, request: ProxyRequest, exchange: _Exchange) -> None:
        log.warning(
            "the client read none of its answer for %g s; cutting it off",
            self._client_timeout,
            extra={"app": app, "request_id": request.request_id},
        )
        exchange.client_gone = True  # uvicorn closes a connection whose answer is incomplete

    async def _answer_error(
        self,
        exc: Exception,
        headers: list[tuple[str, str]],
        request_id: str,
        send: Send,
        exchange: _Exchange,
    ) -> None:
        answer = answer_for(exc, self._show_boot_log)
        exchange.status = answer.status
        accept = next((v for n, v in headers if n == "accept"), "")
        body, extra = render(answer, choose_format(accept), request_id)
        extra.append((b"x-request-id", request_id.encode("latin-1")))
        await send({"type": "http.response.start", "status": answer.status, "headers": extra})
        exchange.answered = True
        await send({"type": "http.response.body", "body": body, "more_body": False})


class AdminApp:
    def __init__(self, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        self._registry = registry
        self._ready = ready

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        content_type = b"text/plain; charset=utf-8"
        if path == "/healthz":
            status, body = 200, b"ok\n"
        elif path == "/readyz":
            ready = self._ready()
            status, body = (200, b"ready\n") if ready else (503, b"not ready\n")
        elif path == "/metrics":
            status, body = 200, generate_latest(self._registry)
            content_type = CONTENT_TYPE_LATEST.encode()
        else:
            status, body = 404, b"not found\n"
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
