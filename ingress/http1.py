"""The proxy port's HTTP/1.1 server: asyncio protocols and httptools, no ASGI in between.

One `_Connection` per client. httptools (llhttp, in its strict mode) parses request heads
and bodies; a parse error (smuggling shapes such as Content-Length with Transfer-Encoding,
two Content-Lengths, obs-fold, a bare LF, a Transfer-Encoding other than `chunked`) is
answered 400 and the connection closes. Parsed requests queue on the connection and one task
answers them in order (pipelining), each through `Handler.handle(request, responder)`; past
`PIPELINE_DEPTH` queued, reading pauses, and past `PIPELINE_MAX` parsed from one read the
connection is refused: those parsed are answered, then a 400, then it closes. Each answer is
drained to the client before the next is started.

Bounds (invariant 18), all per connection, none kept for ever:

- the head's size (431 past `max_head_bytes`, counted while it is read);
- the head's time: complete within `head_timeout` of opening or of the previous answer, or
  the connection closes (408 when a head had begun); an idle keep-alive connection closes
  after `keepalive` seconds;
- open connections: past `max_connections` a new one gets 503 + Retry-After and closes;
- the request body: at most `BODY_BUFFER` bytes wait for the proxy, then reading pauses;
- writes: `Responder.drain` waits for the client's socket at most `client_timeout` seconds.

A client that hangs up, or closes its side (a FIN: as nginx does, taken as giving up; nothing
queued behind it is answered), cancels the exchange answering it (the lease goes back through
`Proxy.finish`). A connection cut short (an answer not finished, a body not read, a
client not reading) is aborted, not closed: nothing unsent is kept for it.

`stop` closes the listener, closes idle connections and WebSocket tunnels, lets exchanges in
progress finish for `grace` seconds, then cancels what is left and waits for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, cast

import httptools

from wakeful.aio.deadline import Deadline
from wakeful.aio.flow import WriteGate
from wakeful.ingress.errors import BadRequest, ClientGone, ClientTooSlow, UpstreamFailed
from wakeful.ingress.websocket import Pipe, is_websocket

log = logging.getLogger(__name__)

LINGER_SECONDS = 5.0
LINGER_BYTES = 16 << 20
"""How long, and how much, a connection answered before its request body was read keeps
reading it away (`_Connection._linger`); nginx's lingering_timeout is 5 s too."""
PIPELINE_DEPTH = 16
"""Requests queued on one connection before reading from it pauses."""
PIPELINE_MAX = 128
"""Requests parsed out of what was already read past which the connection is refused: a
pause stops new reads, not the parsing of the last one (up to 256 KiB of tiny requests)."""
BODY_BUFFER = 256 * 1024
_FRAMING = frozenset({b"transfer-encoding", b"content-length", b"expect"})
"""The request headers the server itself reads."""
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


def _canned(status: int, text: str, *extra: bytes) -> bytes:
    body = text.encode() + b"\n"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n%s\r\n%s"
        % (status, _REASONS[status], len(body), b"".join(extra), body)
    )


BAD_REQUEST = _canned(400, "the request is malformed")
TOO_LARGE = _canned(431, "request line and headers are too large")
TOO_SLOW = _canned(408, "the request head did not come in time")
TOO_MANY = _canned(503, "too many connections to this ingress", b"retry-after: 1\r\n")


@dataclass(frozen=True, slots=True)
class Limits:
    max_head_bytes: int = 32 * 1024
    head_timeout: float = 10.0
    keepalive: float = 5.0
    max_connections: int = 10_000
    client_timeout: float = 60.0


class Body:
    """A request's body as the proxy pulls it; implements `proxy.RequestBody`."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_continue",
        "_done",
        "_error",
        "_size",
        "_waiter",
        "client_gone",
        "started",
    )

    def __init__(self, conn: _Connection, expect_continue: bool) -> None:
        self._conn = conn
        self._continue = expect_continue
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._done = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.started = False
        self.client_gone = False

    @property
    def complete(self) -> bool:
        return self._done and not self._chunks

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > BODY_BUFFER:
            self._conn.pause_reading("body")
        self._wake()

    def end(self) -> None:
        self._done = True
        self._wake()

    def fail(self, exc: Exception) -> None:
        """The rest of the body cannot be read (it is malformed): `stream` raises `exc`."""
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def stream(self) -> AsyncIterator[bytes]:
        self.started = True
        if self._continue and not self._done and not self._chunks:
            self._continue = False
            self._conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        timeout = self._conn.limits.client_timeout
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._size -= len(chunk)
                if self._size <= BODY_BUFFER // 4:
                    self._conn.resume_reading("body")
                yield chunk
                continue
            if self._done:
                return
            if self._error is not None:
                raise self._error
            if self._conn.gone:
                self.client_gone = True
                raise ClientGone("the client hung up while sending its body")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._waiter
            except TimeoutError:
                raise ClientTooSlow(f"the client sent none of its body for {timeout:g} s") from None
            finally:
                self._waiter = None


@dataclass(slots=True)
class Request:
    method: str
    target: bytes
    """Path and query exactly as received."""
    headers: list[tuple[bytes, bytes]]
    """Names lower-cased, values as received, in order."""
    version: str
    keep_alive: bool
    client: str
    body: Body | None
    upgrade: bool = False
    """A WebSocket handshake (`ingress.websocket`): nothing after it on the connection is HTTP."""
    scheme: str = "http"
    """"https" on the TLS listener."""


class Handler(Protocol):
    async def handle(self, request: Request, out: Responder) -> None:
        """Answer `request` through `out`; never raises (but may be cancelled)."""


class Responder:
    """Writes one answer, framing its body: Content-Length when the head has one, chunked for
    HTTP/1.1 otherwise, the end of the connection for HTTP/1.0; no body after HEAD, 1xx, 204
    or 304."""

    __slots__ = ("_chunked", "_conn", "_left", "_no_body", "_request", "complete", "started")

    def __init__(self, conn: _Connection, request: Request) -> None:
        self._conn = conn
        self._request = request
        self._chunked = False
        self._no_body = False
        self._left: int | None = None
        """Body bytes the Content-Length sent still promises (None: no length sent)."""
        self.started = False
        self.complete = False

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        request = self._request
        self.started = True
        self._no_body = request.method == "HEAD" or status in (204, 304) or status < 200
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
        length: bytes | None = None
        for pair in headers:
            if length is None and pair[0] == b"content-length":
                length = pair[1]
            lines.append(b"%s: %s\r\n" % pair)
        if length is not None and not self._no_body:
            self._left = int(length)  # the sandbox's, checked by the upstream parser
        body_unread = request.body is not None and not request.body.complete
        keep = request.keep_alive and not self._conn.last_answer and not body_unread
        if not self._no_body and length is None:
            if request.version == "1.1":
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            else:
                keep = False  # the end of the connection ends the body
        if not keep:
            request.keep_alive = False
            lines.append(b"connection: close\r\n")
        elif request.version == "1.0":
            lines.append(b"connection: keep-alive\r\n")
        lines.append(b"\r\n")
        self._conn.hold(b"".join(lines))

    def write(self, chunk: bytes) -> bool:
        """Send a piece of the body (with the head, the first time). Never more than the
        Content-Length sent promised: past it the answer is cut. True when the client's
        buffer is full: then `await drain()` before writing more."""
        if self._no_body or not chunk:
            return False
        if self._left is not None:
            if len(chunk) > self._left:
                raise UpstreamFailed("the sandbox sent more body than its Content-Length")
            self._left -= len(chunk)
        conn = self._conn
        if self._chunked:
            conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            conn.write(chunk)
        return conn._drain.waiting() is not None

    def flush(self) -> None:
        """Send the head now if no body went with it yet: call before waiting for the body."""
        self._conn._flush()

    async def drain(self) -> None:
        """Wait for room in the client's buffer; TimeoutError when the client reads none of
        it within its timeout."""
        await self._conn.drain()

    def end(self) -> None:
        if self._chunked:
            self._conn.write(b"0\r\n\r\n")
        else:
            self._conn._flush()  # an answer with no body: its head goes now, not at the end
        self.complete = not self._left  # a body short of its Content-Length is cut

    def switch(self, headers: list[tuple[bytes, bytes]]) -> ClientSide:
        """Answer 101 with `headers` and hand over the connection: the client's end of the
        tunnel. The connection closes when the exchange ends."""
        pipe = self._conn.tunnel
        assert self._request.upgrade and pipe is not None
        self.started = self.complete = True
        self._request.keep_alive = False
        lines = [b"HTTP/1.1 101 Switching Protocols\r\n"]
        lines.extend(b"%s: %s\r\n" % pair for pair in headers)
        lines.append(b"\r\n")
        self._conn.write(b"".join(lines))
        return ClientSide(self._conn, pipe)

    def send_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A complete small answer at once (error answers, which carry their length)."""
        if not any(name == b"content-length" for name, _ in headers):
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        self.start(status, headers)
        if not self._no_body:
            self._conn.write(body)
        self._left = None
        self.complete = True


class ClientSide:
    """The client's end of a spliced WebSocket (`ingress.websocket.Side`)."""

    __slots__ = ("_conn", "pipe")

    def __init__(self, conn: _Connection, pipe: Pipe) -> None:
        self._conn = conn
        self.pipe = pipe

    def write(self, data: bytes) -> None:
        self._conn.write(data)

    async def drain(self) -> None:
        await self._conn.drain()
        if self._conn.gone:
            raise ClientGone("the client hung up")


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self.limits = server.limits
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._client = ""
        self.gone = False
        """The client hung up."""
        self.closing = False
        """No request after the one being answered."""
        self._halt = False
        self._refusal: bytes | None = None
        """The answer owed to a request refused while earlier ones are still queued: written
        after theirs, then the connection closes (`_refuse`)."""
        self._queue: collections.deque[Request] = collections.deque()
        self._runner: asyncio.Task[None] | None = None
        """The task answering, while it answers."""
        self._task: asyncio.Task[None] | None = None
        """The connection's task: answers requests in order, waits for the next between them
        (one task per connection, not per request)."""
        self._next: asyncio.Future[None] | None = None
        """What the task waits on while the connection is idle."""
        self._paused: set[str] = set()
        self._drain = WriteGate(self._loop)
        self._held: bytes | None = None
        """An answer's head not written yet (`hold`)."""
        self._lingering = False
        self._lingered = 0
        self._linger_timer: asyncio.TimerHandle | None = None
        self._deadline = Deadline(self._loop, self._timed_out)
        self._head_due: float | None = None
        """When the request head under way (or the next one) must be complete."""
        self._idle_due: float | None = None
        """When a keep-alive connection with no request begun closes."""
        # the request being parsed
        self._in_head = False
        self._head_bytes = 0
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: Body | None = None
        self._last: Request | None = None
        self.tunnel: Pipe | None = None
        """After a WebSocket handshake: what the client sends, for the sandbox."""

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass
        self.transport = transport
        self._server.connections.add(self)
        if len(self._server.connections) > self.limits.max_connections:
            transport.write(TOO_MANY)
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self._client = peer[0] if isinstance(peer, tuple) else ""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the rest of a body nobody will read
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self._close(abort=True)
            return
        if self.tunnel is not None:
            self.tunnel.feed(data)
            return
        if self.closing and self._body is None:  # no new request (`shutdown`, a refusal);
            return  # the body of one being answered is still read
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self._last is not None and self._last.upgrade:  # the rest is the tunnel's
                self.tunnel = Pipe(
                    lambda: self.pause_reading("tunnel"), lambda: self.resume_reading("tunnel")
                )
                self.tunnel.feed(data[exc.args[0] :])
                return
            # Another protocol switch (h2c, CONNECT...) is not served: what is queued is
            # answered, that request as a plain one, and the connection closes after it.
            if self._last is not None:
                self._last.keep_alive = False
            self.pause_reading("upgrade")
            return
        except httptools.HttpParserError as exc:
            if self._body is not None:  # mid-body: the request already went on; it fails
                self._body.fail(BadRequest(f"the request body is malformed: {exc}"))
                self._stop_reading()  # and its own answer says so
                return
            self._refuse(BAD_REQUEST)
            return
        if self._in_head and self._head_bytes > self.limits.max_head_bytes:
            self._refuse(TOO_LARGE)

    def eof_received(self) -> bool:
        """The client closed its side: taken as hanging up (nginx does the same), so the
        exchange under way ends at once and gives its lease back; nothing queued is answered.
        A body still coming can never complete."""
        self.connection_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gone:
            return
        self.gone = True
        self.closing = True
        if self.tunnel is not None:
            self.tunnel.end()
        self._halt = True
        self._server.connections.discard(self)
        self._cancel_timers()
        if self._body is not None:
            self._body._wake()
        for request in self._queue:
            if request.body is not None:
                request.body._wake()
        self._drain.open()
        if self._task is not None:
            self._task.cancel()  # the exchange under way, if any: its client is gone

    def pause_writing(self) -> None:
        self._drain.close()

    def resume_writing(self) -> None:
        self._drain.open()

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []
        self._idle_due = None  # the deadline is the head's now (`_timed_out` looks)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_due = None
        parser = self._parser
        version = parser.get_http_version()
        expect = False
        has_body = False
        for name, value in self._headers:
            if name not in _FRAMING:
                continue
            if name == b"transfer-encoding":
                if value.strip().lower() != b"chunked":  # no other coding is understood
                    raise BadRequest("unsupported transfer-encoding")
                has_body = True
            elif name == b"content-length" and value.strip() not in (b"", b"0"):
                has_body = True
            elif name == b"expect" and value.lower() == b"100-continue":
                expect = version == "1.1"  # HTTP/1.0 has no expectations (RFC 9110 10.1.1)
        if len(self._queue) >= PIPELINE_MAX:
            raise BadRequest("too many pipelined requests")
        body = Body(self, expect) if has_body else None
        self._body = body
        method = parser.get_method().decode("latin-1")
        upgrade = (
            parser.should_upgrade()
            and version == "1.1"  # RFC 6455; and no 1xx may go to an HTTP/1.0 client
            and not has_body
            and is_websocket(method, self._headers)
        )
        request = Request(
            method,
            self._url,
            self._headers,
            version,
            parser.should_keep_alive() and not upgrade,
            self._client,
            body,
            upgrade,
            self._server.scheme,
        )
        self._last = request
        self._queue.append(request)
        if len(self._queue) >= PIPELINE_DEPTH:
            self.pause_reading("pipeline")
        if self._runner is None:
            if self._next is not None:  # the connection's task waits: wake it
                self._runner = self._task
                if not self._next.done():
                    self._next.set_result(None)
            else:
                self._runner = self._task = self._loop.create_task(self._run())

    def on_body(self, body: bytes) -> None:
        if self._body is not None:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self._body is not None:
            self._body.end()
            self._body = None

    # -- answering -----------------------------------------------------------------------

    async def _run(self) -> None:
        """Answer what is queued, in order, then wait for the next request; until the
        connection is done with."""
        try:
            while True:
                while self._queue and not self._halt:
                    request = self._queue.popleft()
                    if self._paused and len(self._queue) < PIPELINE_DEPTH // 2:
                        self.resume_reading("pipeline")
                    out = Responder(self, request)
                    try:
                        await self._server.handler.handle(request, out)
                    except Exception:
                        log.exception("answering a request failed")
                        self._close(abort=True)
                        return
                    body_left = request.body is not None and not request.body.complete
                    if not out.complete:
                        self._close(abort=True)  # the stream is unusable: drop what is unsent
                        return
                    if body_left:  # answered before the body was read (a refusal): no more
                        self._linger()
                        return
                    if not request.keep_alive or self.last_answer:
                        self._close()
                        return
                    try:  # one answer at a time in the buffer, however fast they come
                        self._flush()
                        if self._drain.waiting() is not None:
                            await self.drain()
                    except TimeoutError:
                        self._close(abort=True)
                        return
                if self.gone or self._halt:
                    return
                if self.closing:  # told to stop (`shutdown`) while the last answer drained,
                    if self._refusal is not None:  # or the requests before a refused one done
                        self.write(self._refusal)
                        self._linger()
                        return
                    self._close()
                    return
                self._runner = None
                self._arm_idle_timers()
                self._next = self._loop.create_future()
                try:
                    await self._next  # woken with a request queued (and `_runner` set)
                finally:
                    self._next = None
        except asyncio.CancelledError:
            self._close(abort=True)
        finally:
            self._runner = self._task = None

    def hold(self, head: bytes) -> None:
        """An answer's head, sent with the first body bytes written (one write, one segment:
        most answers are one read from the sandbox). The handler flushes it before it waits
        for a body (`Responder.flush`); whatever is held goes out when the answer ends."""
        if self._held is None:
            self._held = head
        else:
            self._held += head

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self.write(held)

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        if self.transport is not None and not self.gone:
            self.transport.write(data)

    async def drain(self) -> None:
        self._flush()
        drain = self._drain.waiting()
        if drain is None:
            return
        async with asyncio.timeout(self.limits.client_timeout):
            await asyncio.shield(drain)

    def pause_reading(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.gone:
            self.transport.pause_reading()
        self._paused.add(why)

    def resume_reading(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if not self._paused and self.transport is not None and not self.gone:
            self.transport.resume_reading()

    def _stop_reading(self) -> None:
        self.closing = True
        self.pause_reading("closing")

    @property
    def last_answer(self) -> bool:
        """No request after the one being answered is (a refusal owed is not a request)."""
        return self.closing and self._refusal is None

    def _refuse(self, answer: bytes) -> None:
        """A request that cannot be parsed or bounded: nothing after it is read; the requests
        parsed before it are answered in order, then it is, and the connection closes."""
        self._stop_reading()
        if self._runner is None and not self._queue:
            self.write(answer)
            self._linger()  # closing with the client's bytes unread could reset it unread
        else:
            self._refusal = answer

    def _close(self, abort: bool = False) -> None:
        """Close once what is written went out; `abort`: now, dropping it (a client that does
        not read would otherwise keep the connection, and its slot, for ever)."""
        self.closing = True
        self._cancel_timers()
        if not abort:
            self._flush()
        if self.transport is not None:
            if abort:
                self.transport.abort()
            elif not self.transport.is_closing():
                self.transport.close()

    def _linger(self) -> None:
        """A complete answer sent before the request's body was read: half-close (FIN after
        the answer) and read what the client still sends away, for at most `LINGER_SECONDS`
        and `LINGER_BYTES`, before closing. Closing with its bytes unread would make the
        kernel reset the connection, and a client that reads only once it has sent all (curl,
        most libraries) would never see the answer (nginx's lingering close)."""
        self.closing = True
        self._cancel_timers()
        self._flush()
        transport = self.transport
        if transport is None or transport.is_closing() or self.gone:
            return
        if not transport.can_write_eof():  # TLS: no half-close; close after the answer
            transport.close()
            return
        self._lingering = True
        try:
            transport.write_eof()
        except OSError:  # the client reset meanwhile (asyncio's loop raises; uvloop does not)
            self._close(abort=True)
            return
        self._paused.clear()
        transport.resume_reading()
        self._linger_timer = self._loop.call_later(LINGER_SECONDS, self._close, True)

    def shutdown(self) -> None:
        """Stop after the answer under way (now, when there is none); nothing queued behind
        it is answered, not even a refusal."""
        self.closing = True
        self._refusal = None
        if self._runner is None:
            self._close()

    def cancel(self) -> asyncio.Task[None] | None:
        self._halt = True
        runner = self._runner
        if runner is not None:
            runner.cancel()
        return runner

    # -- timers --------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._head_due = self._loop.time() + self.limits.head_timeout
        self._deadline.at(self._head_due)

    def _arm_idle_timers(self) -> None:
        now = self._loop.time()
        self._head_due = now + self.limits.head_timeout
        if not self._in_head:  # a head under way has its own deadline, not the idle one
            self._idle_due = now + self.limits.keepalive
        self._deadline.at(min(self._head_due, self._idle_due or self._head_due))

    def _cancel_timers(self) -> None:
        self._deadline.cancel()
        self._head_due = self._idle_due = None
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None

    def _timed_out(self) -> None:
        """The deadline passed: the idle one's or the head's, or neither any more (it
        moved: wait for what is still due)."""
        now = self._loop.time()
        if self._head_due is not None and now >= self._head_due:
            self._head_due = None
            self._head_late()
        elif self._idle_due is not None and now >= self._idle_due:
            self._idle_due = None
            self._close()
        else:
            due = [d for d in (self._head_due, self._idle_due) if d is not None]
            if due:
                self._deadline.at(min(due))

    def _head_late(self) -> None:
        if self._runner is not None or self._queue:
            return  # answering: the next head's time starts after this answer
        if self._in_head:
            self.write(TOO_SLOW)
        self._close()


class HttpServer:
    def __init__(self, handler: Handler, limits: Limits, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: serve HTTPS with this context; its handshake has the head's deadline."""
        self.handler = handler
        self.limits = limits
        self.tls = tls
        self.scheme = "http" if tls is None else "https"
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, sock: socket.socket, backlog: int) -> None:
        loop = asyncio.get_running_loop()
        if self.tls is None:
            self._server = await loop.create_server(
                lambda: _Connection(self), sock=sock, backlog=backlog
            )
            return
        self._server = await loop.create_server(
            lambda: _Connection(self),
            sock=sock,
            backlog=backlog,
            ssl=self.tls,
            ssl_handshake_timeout=self.limits.head_timeout,
        )

    async def stop(self, grace: float) -> None:
        """Stop accepting, let the answers under way finish for `grace` seconds, then cancel
        the rest and wait for them (their leases go back on the way out). An answer complete
        but not yet read by its client is still sent until the grace ends."""
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
            if conn.tunnel is not None:
                conn.cancel()  # a WebSocket never ends by itself: closed now, clients reconnect
        answering = [conn._runner for conn in self.connections if conn._runner is not None]
        if answering:
            await asyncio.wait(answering, timeout=grace)
        running = [task for conn in list(self.connections) if (task := conn.cancel())]
        if running:
            await asyncio.wait(running, timeout=10)
        while self.connections and loop.time() < until:  # noqa: ASYNC110 (once, at shutdown)
            await asyncio.sleep(0.05)  # closing connections: their last bytes go out
        idle = [task for conn in list(self.connections) if (task := conn._task)]
        for conn in list(self.connections):
            conn._close(abort=True)
        for task in idle:
            task.cancel()
        if idle:
            await asyncio.wait(idle, timeout=10)
