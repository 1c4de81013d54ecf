"""One client connection speaking HTTP/2: `h2` frames it, each stream is one request.

The HTTP/1.1 connection hands the transport over (`ClientConnection._switch`): on the TLS
listener when ALPN chose `h2`, on the plain one when the first bytes are the preface (h2c
with prior knowledge). Each stream runs the same handler an HTTP/1.1 request does, in a task
of its own, with a `StreamBody` and a `StreamResponder` (`http2.stream`): admission, leases,
in-flight counts and the access log see one request per stream.

What a client can hold (invariant 18, and `http2.rules` for the frames `h2` does not bound):
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
import contextlib
import logging
from typing import TYPE_CHECKING, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from wakeful.aio.deadline import Deadline
from wakeful.aio.flow import HIGH_WATER
from wakeful.ingress.errors import BadRequest, ClientGone
from wakeful.ingress.http1.request import Request
from wakeful.ingress.http2.fields import fit
from wakeful.ingress.http2.rules import (
    CONTROL_BURST,
    CONTROL_RATE,
    RESET_BURST,
    RESET_RATE,
    Budget,
    FrameScan,
    malformed_trailers,
    request_head,
)
from wakeful.ingress.http2.sender import Sender
from wakeful.ingress.http2.stream import STREAM_WINDOW, StreamBody, StreamResponder

if TYPE_CHECKING:
    from wakeful.ingress.http1.server import HttpServer

log = logging.getLogger(__name__)

MAX_STREAMS = 100
"""Concurrent streams a client may open on one connection (nginx: 128; h2's default)."""
CONNECTION_WINDOW = 1024 * 1024
"""Request body bytes a whole connection may have waiting for the proxy."""
_CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


class _Advertised(h2.settings.Settings):
    """The settings as sent, MAX_CONCURRENT_STREAMS included, except that h2 is not to
    enforce that one: it makes a stream past it a connection error (every stream under way
    lost), where RFC 9113 §5.1.2 makes it a stream error. `H2Connection._request` refuses such
    a stream alone (REFUSED_STREAM), once its head is decoded (HPACK's context kept)."""

    @property
    def max_concurrent_streams(self) -> int:
        return 2**31 - 1

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = value


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
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            # What goes out was made safe already (`headers.client_response_headers`: names
            # lower-cased, hop-by-hop fields gone; values as httptools or h2 parsed them):
            # checking again costs a fifth of a small answer's time. What comes in is checked.
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            # What comes in is checked by `rules.malformed_request` (and `malformed_trailers`):
            # h2's rules, compiled, and a malformed request a stream error (RFC 9113 §8.1.1)
            # rather than the whole connection's. Split cookies are joined by `request_head`.
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
        )
        self._h2 = h2.connection.H2Connection(config)
        self._h2.local_settings = _Advertised(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.limits.max_head_bytes,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        fit(self._h2, self.limits.max_head_bytes)
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
        self.out = Sender(self._h2, self._loop, self.limits.client_timeout)
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
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
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
                _CALM, "too many PING, SETTINGS, PRIORITY or empty DATA frames", "control-frames"
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
            events = self._h2.receive_data(seen.data)
        except h2.exceptions.ProtocolError as exc:  # h2 has queued its GOAWAY already
            self._goaway(0, str(exc), "protocol", queued=True)
            return
        windows: set[int] | None = None
        """Streams whose window opened in this read (0: the connection's): pumped once."""
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._request(event)
            elif isinstance(event, h2.events.DataReceived):
                self._data(event)
            elif isinstance(event, h2.events.StreamEnded):
                stream = self._streams.get(event.stream_id)
                if stream is not None and stream.body is not None:
                    stream.body.end()
            elif isinstance(event, h2.events.StreamReset):
                if not event.remote_reset:  # h2 reset it for a rule the client broke
                    self._provoked += 1
                self._reset_by_client(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated):
                windows = windows or set()
                windows.add(event.stream_id)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                windows = windows or set()
                windows.add(0)
            elif isinstance(event, h2.events.TrailersReceived):
                stream = self._streams.get(event.stream_id)  # kept from no one: gRPC sends none
                body = None if stream is None else stream.body
                error = malformed_trailers(event.headers)
                if error is None and body is not None and body.short:
                    error = "the request's body is shorter than its content-length"
                if error is not None:  # a stream error (RFC 9113 §8.1.1)
                    self._provoked += 1
                    self._reset(event.stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
                    self._reset_by_client(event.stream_id, error)
                elif body is not None:
                    body.end()
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

    def _request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if self._last_taken is not None and stream_id > self._last_taken:  # after our GOAWAY
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if len(self._streams) >= MAX_STREAMS:  # past what was advertised: this one alone
            self._provoked += 1
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        headers = event.headers
        try:
            method, target, fields, length = request_head(headers, event.stream_ended is not None)
        except BadRequest:
            self._provoked += 1
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        body = None
        if event.stream_ended is None:
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
                self._reset(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                return
            if out.pending or out.ending is not None:
                await out.drain()
            body = stream.body
            if body is not None and not body.complete:  # answered before its body was read:
                self._reset(stream_id, h2.errors.ErrorCodes.NO_ERROR)  # stop (RFC 9113 §8.1)
        except TimeoutError:
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)  # a client that read nothing
        except asyncio.CancelledError:
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
        except Exception:
            log.exception("answering an HTTP/2 stream failed")
            self._reset(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
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

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        data = event.data or b""
        padding = event.flow_controlled_length - len(data)
        if stream is None or stream.body is None:  # a stream already answered: read away
            self._acknowledge(event.stream_id, event.flow_controlled_length)
            return
        if padding:
            self._acknowledge(event.stream_id, padding)
        if data:
            stream.body.feed(data)

    def consumed(self, stream_id: int, size: int) -> None:
        """The proxy read `size` bytes of a stream's body: the client may send as many more."""
        self._acknowledge(stream_id, size)
        self.out.flush()

    def _acknowledge(self, stream_id: int, size: int) -> None:
        if self.gone:
            return
        with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
            self._h2.acknowledge_received_data(size, stream_id)

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
        """A connection error: GOAWAY (unless `h2` `queued` one), every stream cancelled,
        closed once that is written; counted by `reason`."""
        log.info("closing an HTTP/2 connection from %s: %s", self._client, why)
        self._server.cut_off(reason)
        self.closing = self._dead = True
        if not queued:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection(code, additional_data=why.encode()[:200])
        self.out.write_out()  # now: the transport closes next
        for stream in list(self._streams.values()):
            if stream.task is not None:
                stream.task.cancel()
        self._close()

    def shutdown(self) -> None:
        """Take no new stream (a GOAWAY naming the last one taken); the streams under way
        carry on, and the connection closes when the last ends. The GOAWAY is written by
        hand: h2's `close_connection` would end the connection for them too."""
        if self.closing:
            return
        self.closing = True
        self._last_taken = self._h2.highest_inbound_stream_id
        self.out.write_out()
        if self.transport is not None and not self.gone:
            goaway = GoAwayFrame(0, last_stream_id=self._last_taken, error_code=0)
            self.transport.write(goaway.serialize())
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
