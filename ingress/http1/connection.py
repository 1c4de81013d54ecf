"""One client connection of the HTTP/1.1 server: read, parse, queue, answer in order.

httptools (llhttp, strict) parses heads and bodies; a head it cannot parse (obs-fold, a bare
LF, two Content-Lengths, ...) is answered 400 and the connection closes. How a parsed head is
framed, if safely, is `http1.rules.frame_request`'s decision (a refusal is a 400 too; an
absolute-form target is the edge's, `rules.origin_form`). Requests queue and one task
answers them in order (pipelining), each through `Handler.handle(request, responder)`, each
drained before the next; past `PIPELINE_DEPTH` queued reading pauses, and past `PIPELINE_MAX`
parsed from one read those are answered, then a 400, and the connection closes. A request with
no body and nothing before it may be answered without the task (`Handler.direct`, the
proxy's `ingress.direct`), which tells the connection when it ends (`directed`); what comes
meanwhile queues for the task.

What a client can hold is bounded by the server's `Limits` (invariant 18), none for ever;
each refusal is told to the server (`HttpServer.refused`: the metrics). A client that hangs
up, or closes its side (a FIN, as nginx has it: nothing queued behind it is answered),
cancels the exchange answering it (its lease goes back, `Proxy.finish`). A connection cut
short (an answer unfinished, a body unread, a client not reading) is aborted.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Final, cast

import httptools

from wakeful.aio.deadline import Deadline
from wakeful.aio.pipe import Pipe
from wakeful.ingress.errors import BadRequest
from wakeful.ingress.http1.request import Body, Request
from wakeful.ingress.http1.responder import (
    BAD_REQUEST,
    TOO_LARGE,
    TOO_MANY,
    TOO_SLOW,
    Http1Responder,
)
from wakeful.ingress.http1.rules import HEAD_DUE, IDLE_DUE, frame_request, known_version, passed
from wakeful.ingress.http1.wire import Wire
from wakeful.ingress.http2.rules import chose_h2, sniff
from wakeful.ingress.upstream.rules import framing_run

if TYPE_CHECKING:
    from wakeful.ingress.http1.server import Answering, HttpServer

log = logging.getLogger(__name__)

_CONNECTION: Final = frozenset({b"connection", b"proxy-connection"})
"""What llhttp reads as the Connection header (`known_version`)."""
PIPELINE_DEPTH: Final = 16
"""Requests queued on one connection before reading from it pauses."""
PIPELINE_MAX: Final = 128
"""Requests parsed out of what was already read past which the connection is refused: a
pause stops new reads, not the parsing of the last one (up to 256 KiB of tiny requests)."""


class ClientConnection(Wire):
    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop) -> None:
        """`loop`: the server's (`asyncio.get_running_loop` costs a `getpid` each call)."""
        super().__init__(loop, server.limits)
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._client = ""
        self._halt = False
        self._refusal: bytes | None = None
        """The answer owed a request refused behind queued ones, written after theirs."""
        self._queue: collections.deque[Request] = collections.deque()
        self._runner: asyncio.Task[None] | None = None
        """The task answering, while it answers."""
        self._task: asyncio.Task[None] | None = None
        """The connection's one task: answers requests in order, waits between them."""
        self._direct: Answering | None = None
        """The request answered without the task (`Handler.direct`), while it is."""
        self._next: asyncio.Future[None] | None = None  # what the idle task waits on
        self._deadline = Deadline(self._loop, self._timed_out)
        self._head_due: float | None = None  # when the head under way (or next) is due
        self._idle_due: float | None = None  # when an idle keep-alive connection closes
        # the request being parsed
        self._in_head = False
        self._head_bytes = self._framing = 0  # the head's bytes; mid-body, `framing_run`'s
        self._bodied = False
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._connection = False
        """The head under way has a Connection header (`on_headers_complete`)."""
        self._body: Body | None = None
        self._last: Request | None = None
        self.spliced: Pipe | None = None
        """After a WebSocket handshake: what the client sends, for the sandbox."""
        self._sniffed: bytes | None = None
        """On a plain listener serving HTTP/2 too: the first bytes, until they tell whether
        this is an h2c client with prior knowledge (`http2.rules.sniff`); then None."""

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass
        self.transport = transport
        server = self._server
        if server.tls is None and server.full():  # a TLS one was counted from its accept
            server.refused("connections")
            transport.write(TOO_MANY)
            transport.close()
            return
        server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self._client = peer[0] if isinstance(peer, tuple) else ""
        if server.http2 and server.tls is None:
            self._sniffed = b""  # h2c with prior knowledge opens with the preface
        elif server.http2 and chose_h2(transport.get_extra_info("ssl_object")):
            self._switch(b"")
            return
        self._head_due = self._loop.time() + self.limits.head_timeout
        self._deadline.at(self._head_due)

    def data_received(self, data: bytes) -> None:
        if self._sniffed is not None:  # a plain connection's first bytes: HTTP/2's preface?
            data = self._sniff(data)
            if not data:
                return
        if self._lingering:  # the rest of a body nobody will read
            self._read_away(len(data))
            return
        if self.spliced is not None:
            self.spliced.feed(data)
            return
        if self.closing and self._body is None:  # no new request (`shutdown`, a refusal);
            return  # the body of one being answered is still read
        if self._in_head:
            self._head_bytes += len(data)
        self._bodied = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self._last is not None and self._last.upgrade:  # the rest is the splice's
                self.spliced = Pipe(
                    lambda: self.pause_reading("splice"), lambda: self.resume_reading("splice")
                )
                self.spliced.feed(data[exc.args[0] :])
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
            self._refuse(BAD_REQUEST, "malformed")
            return
        if self._in_head and self._head_bytes > self.limits.max_head_bytes:
            self._refuse(TOO_LARGE, "head-too-large")
        elif (body := self._body) is not None and not self._in_head:  # chunk framing and
            self._framing = framing_run(self._framing, len(data), self._bodied)  # trailers,
            if self._framing > self.limits.max_head_bytes:  # bounded as a head is
                self._server.refused("framing")
                body.fail(BadRequest("the request's chunk framing or trailers are too large"))
                self._stop_reading()

    def _sniff(self, data: bytes) -> bytes:
        """What to parse as HTTP/1.1: `data`, or all that came while it might have been the
        HTTP/2 preface; b"" while it still might, or once the connection went to HTTP/2."""
        first = self._sniffed + data if self._sniffed else data
        verdict = sniff(first)
        if verdict is None:
            self._sniffed = first
            return b""
        self._sniffed = None
        if verdict:
            self._switch(first)
            return b""
        return first

    def _switch(self, first: bytes) -> None:
        """Hand the transport to an HTTP/2 connection (`ingress.http2`), with what it sent."""
        from wakeful.ingress.http2.connection import H2Connection  # only when HTTP/2 comes

        self._cancel_timers()
        self._server.connections.discard(self)
        self.closing = self.gone = True  # nothing of HTTP/1.1 happens on it any more
        assert self.transport is not None
        H2Connection.take_over(self._server, self._client, self.transport, first)

    def eof_received(self) -> bool:
        """The client closed its side: it hung up (as nginx has it): the exchange under way
        ends and gives its lease back; nothing queued is answered, no body completes."""
        self.connection_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gone:
            return
        self.gone = True
        self.closing = True
        if self.spliced is not None:
            self.spliced.end()
        self._halt = True
        self._server.connections.discard(self)
        self._cancel_timers()
        if self._body is not None:
            self._body._wake()
        for request in self._queue:
            if isinstance(request.body, Body):
                request.body._wake()
        self._drain.open()
        if self._direct is not None:
            self._direct.cancel()  # the exchange under way: its client is gone
        if self._task is not None:
            self._task.cancel()  # the exchange under way, if any: its client is gone

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []
        self._connection = False
        self._idle_due = None  # the deadline is the head's now (`_timed_out` looks)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a trailer field: dropped (it would reach the sandbox as a
            return  # header no check saw, a second Host say), its bytes bounded (above)
        name = name.lower()
        if name in _CONNECTION:
            self._connection = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._framing, self._bodied = 0, True  # the read that ended the head is not counted
        self._head_due = None
        parser = self._parser
        keep_alive = parser.should_keep_alive()
        version = known_version(keep_alive, self._connection) or parser.get_http_version()
        method = parser.get_method().decode("latin-1")
        frame = frame_request(method, version, self._headers, parser.should_upgrade(), keep_alive)
        if len(self._queue) >= PIPELINE_MAX:
            raise BadRequest("too many pipelined requests")
        body = Body(self, frame.expect_continue) if frame.body else None
        self._body = body
        idle = self._runner is None and self._direct is None and not self._queue
        request = Request(
            method,
            self._url,
            self._headers,
            version,
            frame.keep_alive,
            self._client,
            body,
            frame.upgrade,
            self._server.scheme,
        )
        self._last = request
        if idle and body is None and not frame.upgrade and not self.closing:
            self._direct = self._server.handler.direct(self, request)
            if self._direct is not None:
                return
        self._queue.append(request)
        if len(self._queue) >= PIPELINE_DEPTH:
            self.pause_reading("pipeline")
        if self._runner is None and self._direct is None:
            self._answer_queued()

    def _answer_queued(self) -> None:
        """Have the connection's task answer what is queued: wake it, or start it."""
        if self._next is not None:  # the connection's task waits: wake it
            self._runner = self._task
            if not self._next.done():
                self._next.set_result(None)
        else:
            self._runner = self._task = self._loop.create_task(self._run())

    def on_body(self, body: bytes) -> None:
        self._bodied = True
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
                while not self._halt:
                    if self._drain.waiting() is not None:  # one answer at a time in the buffer,
                        try:  # however fast they come
                            await self.drain()
                        except TimeoutError:
                            self._close(abort=True)
                            return
                    if not self._queue:
                        break
                    request = self._queue.popleft()
                    if self._paused and len(self._queue) < PIPELINE_DEPTH // 2:
                        self.resume_reading("pipeline")
                    out = Http1Responder(self, request)
                    try:
                        await self._server.handler.handle(request, out)
                    except Exception:
                        log.exception("answering a request failed")
                        self._close(abort=True)
                        return
                    if not self._answered(request, out):
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

    def _answered(self, request: Request, out: Http1Responder) -> bool:
        """After an answer: whether the connection goes on (what the answer left is flushed;
        the next waits for it to drain), or it closes, dropping what is unsent when the
        answer is incomplete, reading away a body it left unread."""
        if not out.complete:
            self._close(abort=True)  # the stream is unusable: drop what is unsent
            return False
        if request.body is not None and not request.body.complete:  # answered before its
            self._linger()  # body was read (a refusal): no more
            return False
        if not request.keep_alive or self.last_answer:
            self._close()
            return False
        self.flush()
        return True

    def directed(self, request: Request, out: Http1Responder | None) -> None:
        """The request answered without the task ended (`out`), or handed itself back (None:
        `ingress.direct`'s resend after the keep-alive race), for the task to answer."""
        self._direct = None
        if self.gone:
            return
        if out is None:
            self._queue.appendleft(request)
        elif not self._answered(request, out):
            return
        if self._queue or self.closing or self._drain.waiting() is not None:
            self._answer_queued()
        else:
            self._arm_idle_timers()

    def answering(self) -> asyncio.Future[None] | None:
        """What answers a request now, until it is done (a server stopping waits on it)."""
        if self._direct is not None:
            return self._direct.finished()
        return self._runner

    def _stop_reading(self) -> None:
        self.closing = True
        self.pause_reading("closing")

    @property
    def last_answer(self) -> bool:
        """No request after the one being answered is (a refusal owed is not a request)."""
        return self.closing and self._refusal is None

    def _refuse(self, answer: bytes, reason: str) -> None:
        """Unparsable or past a bound: nothing more is read; the requests parsed before it are
        answered in order, then it is, and the connection closes. Counted by `reason`."""
        self._server.refused(reason)
        self._stop_reading()
        if self._runner is None and self._direct is None and not self._queue:
            self.write(answer)
            self._linger()  # closing with the client's bytes unread could reset it unread
        else:
            self._refusal = answer

    def shutdown(self) -> None:
        """Stop after the answer under way (now if none); nothing queued is answered."""
        self.closing = True
        self._refusal = None
        if self._runner is None and self._direct is None:
            self._close()

    def cancel(self) -> asyncio.Task[None] | None:
        self._halt = True
        if self._direct is not None:
            return self._direct.cancel()
        runner = self._runner
        if runner is not None:
            runner.cancel()
        return runner

    # -- timers --------------------------------------------------------------------------

    def _arm_idle_timers(self) -> None:
        now = self._loop.time()
        self._head_due = now + self.limits.head_timeout
        if not self._in_head:  # a head under way has its own deadline, not the idle one
            self._idle_due = now + self.limits.keepalive
        self._deadline.at(min(self._head_due, self._idle_due or self._head_due))

    def _cancel_timers(self) -> None:
        self._deadline.cancel()
        self._head_due = self._idle_due = None
        super()._cancel_timers()

    def _timed_out(self) -> None:
        """The timer fired: the deadline that passed acts (`rules.passed`), else re-arm."""
        which, later = passed(self._head_due, self._idle_due, self._loop.time())
        if which == HEAD_DUE:
            self._head_due = None
            if self._runner is None and self._direct is None and not self._queue:  # else its
                # time starts after them
                if self._in_head:
                    self._server.refused("slow-head")
                    self.write(TOO_SLOW)
                self._close()
        elif which == IDLE_DUE:
            self._idle_due = None
            self._close()
        elif later is not None:
            self._deadline.at(later)
