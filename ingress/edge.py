"""The edge: where a parsed request becomes a `ProxyRequest` and errors become answers.

`ProxyEdge` is the proxy port's handler for the HTTP/1.1 server in `http1/`: it routes,
forwards through the proxy, streams the answer back, and is the only place our exceptions
become status codes (`answer_for`). `AdminApp` (ASGI, on uvicorn) serves /healthz, /readyz
and /metrics on its own port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final

from wakeful.aio import trace
from wakeful.domain.leases import ActivatorError
from wakeful.ingress import grpc
from wakeful.ingress.accesslog import AccessLog
from wakeful.ingress.acme import CHALLENGE_PREFIX
from wakeful.ingress.cacherules import CachedLease, Use
from wakeful.ingress.clients import ClientShares, client_key
from wakeful.ingress.direct import Direct
from wakeful.ingress.errors import (
    BadRequest,
    ClientBusy,
    HeadersTooLarge,
    IngressError,
    UpstreamError,
    UpstreamTimeout,
)
from wakeful.ingress.formats import CLIENT_GONE, answer_for, choose_format, render
from wakeful.ingress.headers import header, last_header, new_request_id, read_request_head
from wakeful.ingress.http1 import Handler, Request, Responder
from wakeful.ingress.http1.rules import origin_form
from wakeful.ingress.http2.stream import StreamBody
from wakeful.ingress.metrics import IngressMetrics
from wakeful.ingress.proxy import Proxy, ProxyRequest, ProxyResponse
from wakeful.ingress.websocket import splice, upgrade_headers

if TYPE_CHECKING:
    from wakeful.ingress.http1.connection import ClientConnection

log = logging.getLogger(__name__)

# Bound once: compiled, `module.name` is a lookup on the module at every call.
_clock: Final = time.perf_counter
_TRACING: Final = trace.ENABLED


class ProxyEdge(Handler):
    """Answers each request the HTTP/1.1 server (`http1/`) parsed: route, forward through
    the proxy, stream the answer back. A client that hangs up cancels this (the server does),
    and `Proxy.finish` gives the lease back."""

    def __init__(
        self,
        proxy: Proxy,
        metrics: IngressMetrics,
        max_header_bytes: int,
        show_boot_log: bool = False,
        websocket_limits: Callable[[str], tuple[float, float]] = lambda app: (600.0, 86_400.0),
        https_location: Callable[[str, str, bytes], str | None] | None = None,
        acme_answer: Callable[[bytes], Awaitable[bytes | None]] | None = None,
        access: AccessLog | None = None,
        clients: ClientShares | None = None,
        trust_forwarded: bool = False,
        direct: bool = True,
    ) -> None:
        """`websocket_limits`: an app's WebSocket idle timeout and maximum duration.
        `https_location(app, host, target)`: where a plain HTTP request of the app is
        redirected (308), or None to serve it; None when no app is. `acme_answer(target)`:
        the key authorization of an ACME HTTP-01 challenge, answered on the plain listener
        before routing (`ingress.acme`). `access`: the access log, for every app's requests
        or those of apps whose leases ask for it (`ingress.accesslog`). `clients`: each
        client's share of requests under way (`ingress.clients`), a client known by its
        address, or by the last X-Forwarded-For entry when `trust_forwarded`."""
        self._proxy = proxy
        self._metrics = metrics
        self._max_header_bytes = max_header_bytes
        self._show_boot_log = show_boot_log
        self._websocket_limits = websocket_limits
        self._https_location = https_location
        self._acme_answer = acme_answer
        self._access = access
        self._clients = clients
        self._trust_forwarded = trust_forwarded
        self._direct = direct

    async def handle(self, request: Request, out: Responder) -> None:
        """Route, forward and stream the answer back. Errors before the answer starts become
        an error answer (`answer_for`); after, the client connection is cut (its body is
        incomplete: `out` is left incomplete and the server closes the connection). Whatever
        ends it, the lease uses it took go back (`Proxy.finish`). One coroutine, not one
        per step: this runs for every request."""
        started = _clock()
        headers = request.headers
        target = request.target
        if target[:1] != b"/":  # absolute-form (rare): origin-form, and its host the Host
            target, headers = origin_form(target, headers)
        head = read_request_head(headers)
        request_id = request.request_id or head.client_request_id or new_request_id()
        label = "-"
        version: str | None = None
        reported: str | None = None
        """The version the answer is counted for: only a split or tagged app's."""
        status = 500
        client_gone = False
        expired = False
        """A call's own `grpc-timeout` passed before its answer began: the client's bound,
        counted as its giving up (499, DEADLINE_EXCEEDED), never as the app's 5xx."""
        response: ProxyResponse | None = None
        share: str | None = None
        """The client the request counts for, while it counts (`ingress.clients`)."""
        sent = 0
        """Body bytes relayed to the client (for the access log)."""
        call = request.version == "2" and grpc.is_call(header(headers, b"content-type"))
        """A gRPC call: streamed both ways, its errors in gRPC's terms (`ingress.grpc`)."""
        try:
            if head.hosts > 1:
                raise BadRequest(f"{head.hosts} Host headers: a request has exactly one")
            if not head.hosts and request.version == "1.1":
                raise BadRequest("no Host header: an HTTP/1.1 request has exactly one")
            if len(target) + head.size > self._max_header_bytes:
                raise HeadersTooLarge(
                    f"request line and headers exceed {self._max_header_bytes} bytes"
                )
            if request.method == "CONNECT":  # a tunnel to anywhere: never a proxy's to open
                raise BadRequest("CONNECT is not served here")
            if target[:1] != b"/":  # `*`, authority-form: before anything puts it in a URL
                shown = target[:80].decode("latin-1")  # (an HTTPS redirect's Location)
                raise BadRequest(f"request target {shown!r} is not a path")
            if (
                request.scheme == "http"
                and target.startswith(CHALLENGE_PREFIX)
                and self._acme_answer is not None
                and (answer := await self._acme_answer(target)) is not None
            ):
                status = 200
                out.send_whole(200, [(b"content-type", b"text/plain")], answer)
                return
            proxy = self._proxy
            app, version, counted = request.route or proxy.route(head.host)
            label = app
            if counted:  # a split or tagged app: its answers per version too (not otherwise)
                reported = version
            if _TRACING:
                trace.mark("routed", app)
            if (
                self._https_location is not None
                and request.scheme == "http"
                and (location := self._https_location(app, head.host, target))
            ):
                status = 308
                moved = [(b"location", location.encode("latin-1"))]
                out.send_whole(308, moved, b"this app is served over HTTPS\n")
                return
            proxied = ProxyRequest(
                request.method,
                target,
                headers,
                request.client,
                request.scheme,
                request_id,
                request.body,
                request.upgrade,
                call,
                resent=request.resent,
            )
            if self._clients is not None:
                try:
                    share = self._admit(request.client, headers)
                except ClientBusy:
                    reported = None  # it never reached the version: not one of its answers
                    raise
            deadline = None
            if call:
                deadline = self._call(app, request, proxied)
            tracker = self._metrics.tracker(app)
            held: list[Use] = []
            streaming = False
            try:
                if deadline is None:
                    response = await proxy.open(app, proxied, tracker, held, version, reported)
                else:
                    async with asyncio.timeout(deadline):
                        response = await proxy.open(app, proxied, tracker, held, version, reported)
                status = response.status
                upstream = response.upstream
                if upstream.splice is not None:
                    if share is not None:  # switched: it holds no upstream slot any more
                        self._leave(share)
                        share = None
                    client = out.switch(upgrade_headers(response.headers))
                    with self._metrics.websocket(app):
                        idle, longest = self._websocket_limits(app)
                        why = await splice(client, upstream.splice, idle, longest)
                    log.debug("websocket ended: %s", why, extra={"app": app})
                    return
                out.start(status, response.headers)
                streaming = True
                while True:
                    chunk = upstream.next_nowait()
                    if chunk is None:  # the rest comes later: the head goes out meanwhile
                        out.flush()
                        chunk = await upstream.next()
                    if not chunk:
                        break
                    full = out.write(chunk)
                    sent += len(chunk)  # after: a write refused (past the length) sent none
                    if full:
                        await out.drain()
                out.end(upstream.trailers)
            # Not `exc`: compiled, the name would keep this clause's type for the one below.
            except UpstreamError as broke:
                if not streaming:
                    raise  # an error answer (or, past a 101, the end of a WebSocket), below
                proxy.count_error(app, broke)
                if out.unstart():  # none of the answer went (its head was held): a 502
                    raise
                log.warning(
                    "upstream broke mid-answer; cutting the client off: %s",
                    broke,
                    extra={"app": app, "request_id": request_id},
                )
                status = 502
            except TimeoutError:
                if not streaming:
                    if call:  # `deadline` passed before the answer began
                        expired = True
                        raise UpstreamTimeout("the call's grpc-timeout passed") from None
                    raise
                log.warning(
                    "the client read none of its answer in time; cutting it off",
                    extra={"app": app, "request_id": request_id},
                )
                client_gone = True
            finally:
                tracker.finish()
                # Not awaited here: compiled, an `await` in a `finally` loses the exception in
                # flight (a cancellation: the client gone), mypyc/mypyc#1114.
                proxy.release_soon(proxy.finish(response, held))
        except (IngressError, ActivatorError) as exc:
            if request.body is not None and request.body.client_gone:
                client_gone = True
            elif out.started:
                log.warning("request ended without an answer: %s", exc, extra={"app": label})
            elif call:
                status = self._answer_call_error(exc, request_id, out)
            else:
                status = self.answer_error(exc, headers, request_id, out)
        except asyncio.CancelledError:
            client_gone = True  # the client hung up (or the ingress is stopping)
            raise
        finally:
            if share is not None:
                self._leave(share)
            seconds = _clock() - started
            final = CLIENT_GONE if client_gone or expired else status
            self._metrics.answered(label, final, seconds, reported)
            code = None
            if call:  # its outcome is its grpc-status: counted apart, for calls only
                if expired:
                    code = grpc.DEADLINE_EXCEEDED
                elif response is None or final != response.status:  # the ingress's own error,
                    code = grpc.call_code(final)  # a client gone, an answer cut off
                else:
                    code = grpc.call_code(final, response.headers, response.upstream.trailers)
                self._metrics.called(label, code)
            if self._access is not None and label != "-":
                self._access.request(
                    label,
                    version,
                    None if response is None else response.lease,
                    request.method,
                    target,
                    final,
                    sent,
                    seconds,
                    "" if response is None else response.woke_by,
                    request_id,
                    code,
                )

    def direct(self, conn: ClientConnection, request: Request) -> Direct | None:
        """Answer `request` (no body, nothing queued before it on `conn`) in callbacks, when
        nothing on its way needs a wait (`ingress.direct`): the edge's checks pass, it has a
        route and no redirect, its client has room, and `Proxy.take_direct` finds a cached
        lease with room and an idle connection. None, with nothing taken or counted, sends
        it the general path (`handle`), which answers whatever this does not."""
        if not self._direct or request.resent or request.method == "CONNECT":
            return None
        started = _clock()
        target = request.target
        if target[:1] != b"/":
            return None
        headers = request.headers
        head = read_request_head(headers)
        if head.hosts != 1 or len(target) + head.size > self._max_header_bytes:
            return None
        if (
            request.scheme == "http"
            and self._acme_answer is not None
            and target.startswith(CHALLENGE_PREFIX)
        ):
            return None
        proxy = self._proxy
        try:
            route = proxy.find_route(head.host)
        except BadRequest:  # a Host that is no host: `handle` answers it
            return None
        if route is None:
            return None
        request.route = route  # kept if `handle` answers it: a split picks once a request
        app, version, counted = route
        if (
            self._https_location is not None
            and request.scheme == "http"
            and self._https_location(app, head.host, target)
        ):
            return None
        share: str | None = None
        if self._clients is not None:
            try:
                share = self._admit(request.client, headers)
            except ClientBusy:
                return None
        taken = proxy.take_direct(app, version)
        if taken is None:
            self.left(share)
            return None
        if _TRACING:
            trace.mark("routed", app)
        use, idle = taken
        tracker = self._metrics.tracker(app)
        tracker.hold()
        request_id = head.client_request_id or new_request_id()
        reported = version if counted else None
        exchange = Direct(
            self,
            proxy,
            conn,
            request,
            app,
            reported,
            use,
            idle,
            tracker,
            share,
            request_id,
            started,
        )
        return exchange if exchange.send() else None

    def left(self, share: str | None) -> None:
        """A request's client share goes back (`_admit`), if it took one."""
        if share is not None:
            self._leave(share)

    def ended_direct(
        self,
        app: str,
        reported: str | None,
        lease: CachedLease,
        method: str,
        target: bytes,
        final: int,
        sent: int,
        seconds: float,
        request_id: str,
    ) -> None:
        """A direct exchange's end, counted and logged as `handle` counts and logs."""
        self._metrics.answered(app, final, seconds, reported)
        if self._access is not None:
            self._access.request(
                app, None, lease, method, target, final, sent, seconds, "", request_id, None
            )

    def _admit(self, peer: str, headers: Sequence[tuple[bytes, bytes]]) -> str:
        """Count the request for its client (`ingress.clients`); ClientBusy past its share."""
        shares = self._clients
        assert shares is not None
        forwarded = last_header(headers, b"x-forwarded-for") if self._trust_forwarded else None
        key = client_key(peer, forwarded)  # the balancer's entry: the last of the last field
        if not shares.take(key):
            raise ClientBusy(
                f"client {key} has {shares.limit} requests under way (requests_per_client); "
                "send the next when one ends",
                retry_after=1,
            )
        return key

    def _leave(self, key: str) -> None:
        assert self._clients is not None
        self._clients.give_back(key)

    def _call(self, app: str, request: Request, proxied: ProxyRequest) -> float | None:
        """A gRPC call's bounds: its body's silences are the app's stream idle timeout; its
        `grpc-timeout` bounds the wait for a sandbox (the seconds it gives, or None), and the
        sandbox is told what is left of it when the call is sent (`ProxyRequest.deadline`)."""
        body = request.body
        if isinstance(body, StreamBody):
            body.quiet = self._websocket_limits(app)[0]
        seconds = grpc.parse_timeout(header(request.headers, b"grpc-timeout"))
        if seconds is not None:
            proxied.deadline = time.monotonic() + seconds
        return seconds

    def _answer_call_error(self, exc: Exception, request_id: str, out: Responder) -> int:
        """A gRPC call's error answer: trailers-only, the code for the HTTP status the error
        would get, its text as the message. Returns the HTTP status it stands for."""
        answer = answer_for(exc, False)
        message = f"{answer.error}: {answer.detail}"
        fields = grpc.error_head(grpc.code_for(answer.status), message)
        fields.append((b"x-request-id", request_id.encode("latin-1")))
        if answer.retry_after is not None:
            fields.append((b"retry-after", b"%d" % answer.retry_after))
        out.start(200, fields)
        out.end()
        return answer.status

    def answer_error(
        self,
        exc: Exception,
        headers: list[tuple[bytes, bytes]],
        request_id: str,
        out: Responder,
    ) -> int:
        """Answer `exc` in the client's format; returns the status sent."""
        answer = answer_for(exc, self._show_boot_log)
        accept = (header(headers, b"accept") or b"").decode("latin-1")
        body, extra = render(answer, choose_format(accept), request_id)
        extra.append((b"x-request-id", request_id.encode("latin-1")))
        out.send_whole(answer.status, extra, body)
        return answer.status
