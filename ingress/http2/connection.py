"""One client connection speaking HTTP/2: `http2.wire` frames it, each stream is one request.

The HTTP/1.1 connection hands the transport over (`ClientConnection._switch`): on the TLS
listener when ALPN chose `h2`, on the plain one when the first bytes are the preface (h2c
with prior knowledge). Each stream runs the same handler an HTTP/1.1 request does, in a task
of its own, with a `StreamBody` and a `StreamResponder` (`http2.stream`): admission, leases,
in-flight counts and the access log see one request per stream.

What a client can hold (invariant 18, and `http2.budgets` for the frames the windows do not bound):
at most `MAX_STREAMS` streams at once (the next one refused alone), `STREAM_WINDOW` unread
bytes a stream and `CONNECTION_WINDOW` a connection (what a stream leaves unread is
acknowledged when it ends), a header block of the head bound, budgets of control frames,
WINDOW_UPDATEs and resets, an unfinished header block for the head timeout, an idle
connection for the keep-alive timeout, and reading stops while what is written for it waits
(a client that sends PINGs and SETTINGS but never reads cannot grow the buffer of their
acknowledgements; a connection closed on it is aborted after its timeout). A stream the
client resets is cancelled at once: its lease goes back. The writing is `http2.sender`'s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from wakeful.aio.deadline import Deadline
from wakeful.aio.flow import HIGH_WATER
from wakeful.ingress.errors import BadRequest, ClientGone
from wakeful.ingress.http1.request import Request
from wakeful.ingress.http2.budgets import (
    CONTROL_BURST,
    CONTROL_RATE,
    RESET_BURST,
    RESET_RATE,
    Budget,
    FrameScan,
)
from wakeful.ingress.http2.frames import (
    CANCEL,
    ENHANCE_YOUR_CALM,
    INTERNAL_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    goaway_frame,
)
from wakeful.ingress.http2.rules import (
    malformed_trailers,
    request_head,
)
from wakeful.ingress.http2.sender import Sender
from wakeful.ingress.http2.stream import STREAM_WINDOW, StreamBody, StreamResponder
from wakeful.ingress.http2.wire import (
    BODY,
    REQUEST,
    RESET,
    TRAILERS,
    WINDOW,
    Event,
    Wire,
    WireError,
)

if TYPE_CHECKING:
    from wakeful.ingress.http1.server import HttpServer

log = logging.getLogger(__name__)

MAX_STREAMS = 100
"""Concurrent streams a client may open on one connection (nginx: 128; h2's default)."""
CONNECTION_WINDOW = 1024 * 1024
"""Request body bytes a whole connection may have waiting for the proxy."""
_CALM = ENHANCE_YOUR_CALM


class _Stream:
    __slots__ = ("body", "out", "task")

    def __init__(self, body: StreamBody | None, out: StreamResponder) -> None:
        self.body = body
        self.out = out
        self.task: asyncio.Task[None] | None = None


class H2Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer, client: str) -> None:
        self._server = server
        self._client = client
        self.limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._wire = Wire(MAX_STREAMS, self.limits.max_head_bytes, STREAM_WINDOW)
        """MAX_CONCURRENT_STREAMS is advertised; a stream past it is refused alone
        (`_request`: RFC 9113 §5.1.2 makes it a stream error), once its head is decoded."""
        self._scan = FrameScan(self.limits.max_head_bytes, preface=True)
        now = self._loop.time()
        self._control = Budget(CONTROL_BURST, CONTROL_RATE, now)
        self._resets = Budget(RESET_BURST, RESET_RATE, now)
        self._windows = Budget(CONTROL_BURST, CONTROL_RATE, now)
        self._provoked = 0
        """Streams the ingress reset because of what the client sent, in the read at hand."""
        self._abort: asyncio.TimerHandle | None = None
        """After a close: the abort of a client that does not read what is left."""
        self.transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        self.out = Sender(self._wire, self._loop, self.limits.client_timeout)
        self.gone = False
        self.closing = False
        """The connection closes once its streams end: our GOAWAY went (newer streams are
        refused), or the client's came (it opens none after it)."""
        self._dead = False
        """A connection error ended it: nothing more is read."""
        self._last_taken: int | None = None
        """After our graceful GOAWAY: the last stream it names (newer ones are refused)."""
        self._deadline = Deadline(self._loop, self._timed_out)
        self._idle_due: float | None = None
        self._block_due: float | None = None

    @classmethod
    def take_over(
        cls, server: HttpServer, client: str, transport: asyncio.Transport, first: bytes
    ) -> H2Connection:
        """Serve HTTP/2 on a connection the HTTP/1.1 server accepted, `first` its bytes read."""
        h2 = cls(server, client)
        transport.set_protocol(h2)
        h2.connection_made(transport)
        if first:
            h2.data_received(first)
        return h2

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.out.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=HIGH_WATER)
        self._server.h2.add(self)
        self._wire.initiate_connection()
        self._wire.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
        self.out.flush()
        self._idle()

    def data_received(self, data: bytes) -> None:
        if self._dead:
            return
        seen = self._scan.feed(data)
        now = self._loop.time()
        if seen.refusal is not None:
            self._goaway(_CALM, seen.refusal, "header-block")
            return
        sent = self.out.take_data_frames()  # earned: a client answers DATA with WINDOW_UPDATEs,
        if sent:  # and grpc's clients with a PING (their bandwidth probe)
            self._windows.give(2 * sent)
            self._control.give(sent)
        if seen.control and not self._control.spend(seen.control, now):
            self._goaway(
                _CALM,
                "too many PING, SETTINGS, PRIORITY, empty DATA or CONTINUATION frames",
                "control-frames",
            )
            return
        if seen.resets and not self._resets.spend(seen.resets, now):
            self._goaway(_CALM, "too many streams reset", "resets")
            return
        if seen.windows and not self._windows.spend(seen.windows, now):
            self._goaway(_CALM, "too many WINDOW_UPDATE frames", "control-frames")
            return
        if self._scan.open_block:
            if self._block_due is None:
                self._block_due = now + self.limits.head_timeout
                self._deadline.at(self._block_due)
        else:
            self._block_due = None
        if seen.goaway:
            self.closing = True  # no stream after it; those under way are answered
        try:
            events = self._wire.receive(seen.data)
        except WireError as exc:  # its GOAWAY is queued already
            self._goaway(exc.code, str(exc), "protocol", queued=True)
            return
        if (stray := self._wire.take_stray()) and not self._control.spend(stray, now):
            self._goaway(_CALM, "too many frames on closed streams", "control-frames")
            return
        windows: set[int] | None = None
        """Streams whose window opened in this read (0: the connection's): pumped once."""
        for event in events:
            kind = event.kind
            if kind == REQUEST:
                self._request(event)
            elif kind == BODY:
                self._data(event)
            elif kind == WINDOW:
                windows = windows or set()
                windows.add(event.stream_id)
            elif kind == RESET:
                if not event.remote:  # reset for a rule the client broke
                    self._provoked += 1
                self._reset_by_client(event.stream_id)
            elif kind == TRAILERS:
                stream = self._streams.get(event.stream_id)  # kept from no one: gRPC sends none
                body = None if stream is None else stream.body
                error = malformed_trailers(event.headers or [])
                if error is not None:  # a stream error (RFC 9113 §8.1.1)
                    self._malformed(event.stream_id, error)
                elif body is not None:
                    self._end_body(event.stream_id, body)
        if windows is not None:  # once a read, however many WINDOW_UPDATEs it held
            if 0 in windows:
                self.out.pump_all(stream.out for stream in self._streams.values())
            else:
                opened = (self._streams.get(stream_id) for stream_id in windows)
                self.out.pump_all(stream.out for stream in opened if stream is not None)
        provoked, self._provoked = self._provoked, 0
        if provoked and not self._resets.spend(provoked, now):
            self._goaway(_CALM, "too many streams reset", "resets")
            return
        self.out.flush()
        if self._streams:
            self._idle_due = None
        elif self.closing:
            self._close_when_done()

    def eof_received(self) -> bool:
        self.connection_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gone:
            return
        self.gone = self.closing = True
        if self._abort is not None:
            self._abort.cancel()
        self._deadline.cancel()
        self._server.h2.discard(self)
        self.out.lost()
        for stream in list(self._streams.values()):
            if stream.body is not None:
                stream.body.fail(ClientGone("the client hung up"))
            if stream.task is not None:
                stream.task.cancel()

    def pause_writing(self) -> None:
        self.out.paused()
        if self.transport is not None and not self.gone:
            self.transport.pause_reading()  # its acknowledgements would pile up unread

    def resume_writing(self) -> None:
        self.out.resumed()
        self.out.pump_all(stream.out for stream in self._streams.values())
        if self.transport is not None and not self.gone and not self._dead:
            self.transport.resume_reading()

    # -- streams -------------------------------------------------------------------------

    def _request(self, event: Event) -> None:
        stream_id = event.stream_id
        if self._last_taken is not None and stream_id > self._last_taken:  # after our GOAWAY
            self._provoked += 1  # (a client racing it opens at most MAX_STREAMS)
            self.out.reset(stream_id, None, REFUSED_STREAM)
            return
        if len(self._streams) >= MAX_STREAMS:  # past what was advertised: this one alone
            self._provoked += 1
            self.out.reset(stream_id, None, REFUSED_STREAM)
            return
        try:
            method, target, fields, length = request_head(event.headers or [], event.ended)
        except BadRequest:
            self._provoked += 1
            self.out.reset(stream_id, None, PROTOCOL_ERROR)
            return
        body = None
        if not event.ended:
            body = StreamBody(self, stream_id, self.limits.client_timeout, length)
        out = StreamResponder(self.out, stream_id, method == "HEAD")
        stream = _Stream(body, out)
        self._streams[stream_id] = stream
        request = Request(
            method, target, fields, "2", True, self._client, body, False, self._server.scheme
        )
        stream.task = self._loop.create_task(self._answer(stream_id, stream, request))

    async def _answer(self, stream_id: int, stream: _Stream, request: Request) -> None:
        out = stream.out
        try:
            await self._server.handler.handle(request, out)
            if not out.complete:
                self._reset(stream_id, INTERNAL_ERROR)
                return
            if out.pending or out.ending is not None:
                await out.drain()
            body = stream.body
            if body is not None and not body.complete:  # answered before its body was read:
                self._reset(stream_id, NO_ERROR)  # stop (RFC 9113 §8.1)
        except TimeoutError:
            self._reset(stream_id, CANCEL)  # a client that read nothing
        except asyncio.CancelledError:
            self._reset(stream_id, CANCEL)
        except Exception:
            log.exception("answering an HTTP/2 stream failed")
            self._reset(stream_id, INTERNAL_ERROR)
        finally:
            self._streams.pop(stream_id, None)
            self._forget_body(stream_id, stream.body)
            out.closed = True
            self.out.flush()
            if not self._streams:
                if self.closing:
                    self._close_when_done()
                else:
                    self._idle()

    def _data(self, event: Event) -> None:
        stream_id = event.stream_id
        stream = self._streams.get(stream_id)
        data = event.data
        padding = event.flow - len(data)
        if stream is None or stream.body is None:  # a stream already answered: read away
            self._acknowledge(stream_id, event.flow)
            return
        body = stream.body
        if padding:
            self._acknowledge(stream_id, padding)
        if data:
            body.feed(data)
            if body.long:  # past its Content-Length
                self._malformed(stream_id, "the request's body is past its content-length")
                return
        if event.ended:
            self._end_body(stream_id, body)

    def _end_body(self, stream_id: int, body: StreamBody) -> None:
        if body.short:
            self._malformed(stream_id, "the request's body is shorter than its content-length")
        else:
            body.end()

    def _malformed(self, stream_id: int, why: str) -> None:
        """A stream error for a malformed request (RFC 9113 §8.1.1): RST_STREAM
        PROTOCOL_ERROR, the stream's task cancelled, counted as a reset the client provoked."""
        self._provoked += 1
        self._reset(stream_id, PROTOCOL_ERROR)
        self._reset_by_client(stream_id, why)

    def consumed(self, stream_id: int, size: int) -> None:
        """The proxy read `size` bytes of a stream's body: the client may send as many more."""
        self._acknowledge(stream_id, size)
        self.out.flush()

    def _acknowledge(self, stream_id: int, size: int) -> None:
        if not self.gone:
            self._wire.acknowledge(size, stream_id)

    def _forget_body(self, stream_id: int, body: StreamBody | None) -> None:
        """A stream is over: what its client sent and nobody read is acknowledged (a body
        answered before it was read, a call refused before its message was)."""
        if body is not None and (unread := body.drop_unread()):
            self._acknowledge(stream_id, unread)

    def _reset_by_client(self, stream_id: int, why: str = "the client reset the stream") -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        self._forget_body(stream_id, stream.body)
        stream.out.closed = True
        if stream.body is not None:
            stream.body.fail(ClientGone(why))
        if stream.task is not None:
            stream.task.cancel()

    def _reset(self, stream_id: int, code: int) -> None:
        stream = self._streams.get(stream_id)
        self.out.reset(stream_id, None if stream is None else stream.out, code)

    # -- ending ----------------------------------------------------------------------------

    def _goaway(self, code: int, why: str, reason: str, queued: bool = False) -> None:
        """A connection error: GOAWAY (unless the wire `queued` one), every stream cancelled,
        closed once that is written; counted by `reason`."""
        log.info("closing an HTTP/2 connection from %s: %s", self._client, why)
        self._server.cut_off(reason)
        self.closing = self._dead = True
        if not queued:
            self._wire.close_connection(code, why.encode()[:200])
        self.out.write_out()  # now: the transport closes next
        for stream in list(self._streams.values()):
            if stream.task is not None:
                stream.task.cancel()
        self._close()

    def shutdown(self) -> None:
        """Take no new stream (a GOAWAY naming the last one taken); the streams under way
        carry on, and the connection closes when the last ends. The GOAWAY is written
        straight to the transport, after what waits to go out."""
        if self.closing:
            return
        self.closing = True
        self._last_taken = self._wire.named_last = self._wire.highest_inbound_stream_id
        self.out.write_out()
        if self.transport is not None and not self.gone:
            self.transport.write(goaway_frame(self._last_taken, NO_ERROR))
        self._close_when_done()

    def tasks(self) -> list[asyncio.Task[None]]:
        return [s.task for s in self._streams.values() if s.task is not None]

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _close_when_done(self) -> None:
        if not self._streams and self.transport is not None:
            self.out.write_out()
            self._close()

    def _close(self) -> None:
        """Close once what is written went out; abort if the client has not read it within
        its timeout (a client that never reads would keep the connection, and its slot)."""
        if self.transport is not None and self._abort is None:
            self.transport.close()
            self._abort = self._loop.call_later(self.limits.client_timeout, self.abort)

    def _idle(self) -> None:
        self._idle_due = self._loop.time() + self.limits.keepalive
        due = self._idle_due if self._block_due is None else min(self._idle_due, self._block_due)
        self._deadline.at(due)

    def _timed_out(self) -> None:
        now = self._loop.time()
        if self._block_due is not None and now >= self._block_due:
            self._goaway(_CALM, "a header block did not end in time", "slow-header-block")
        elif self._idle_due is not None and now >= self._idle_due and not self._streams:
            self.shutdown()
        else:
            due = [d for d in (self._block_due, self._idle_due) if d is not None]
            if due:
                self._deadline.at(min(due))
