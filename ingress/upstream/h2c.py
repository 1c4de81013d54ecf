"""Cleartext HTTP/2 to the sandboxes of apps that ask for it (`protocol = "h2c"`: gRPC).

One `H2Upstream` per connection carries many exchanges at once, one stream each; `H2Pool`
keeps a sandbox's connections and opens another only when every one is at the sandbox's
`MAX_CONCURRENT_STREAMS` (or going away). Each exchange (`H2Exchange`) is an
`UpstreamResponse`: its head, its body as it comes, its trailers (`grpc-status`), and
`close`, which resets a stream the client left (RST_STREAM CANCEL: the sandbox stops work on
it at once).

- **Bounds.** What the sandbox sends waits for the client at most `STREAM_WINDOW` bytes a
  stream and `CONNECTION_WINDOW` a connection: bytes are acknowledged (WINDOW_UPDATE) only as
  the client side takes them. What the client sends goes out as the sandbox's windows allow;
  the body's reader waits meanwhile, so the client's own window closes (backpressure end to
  end). Each exchange holds one of its app's upstream slots (`upstream.pool.Slots`): for an
  h2c app they count streams, not connections. A sandbox that leaves `MAX_UNSENT` bytes of
  what the ingress wrote unread is cut off.
- **Silence.** The head within `UpstreamRequest.timeout`; then, for a call that streams
  (`UpstreamRequest.idle`), each read within `idle` and the whole exchange within
  `longest`; for others, each read within `timeout` too.
- **How it fails.** Connecting: `ConnectFailed`. A stream the sandbox refused
  (REFUSED_STREAM) or a GOAWAY that left it out was never processed: `ClosedUnanswered`, as
  an HTTP/1.1 connection closed before its answer (`ingress.retry` may send it again).
  Anything after the request went: `UpstreamFailed`, `UpstreamTimeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Sequence

from wakeful.aio.deadline import Deadline
from wakeful.aio.flow import HIGH_WATER, WriteGate
from wakeful.ingress.errors import ClosedUnanswered, UpstreamFailed
from wakeful.ingress.http2.budgets import (
    CONTROL_BURST,
    CONTROL_RATE,
    RESET_BURST,
    RESET_RATE,
    Budget,
    FrameScan,
)
from wakeful.ingress.http2.client import ANSWER, ClientWire
from wakeful.ingress.http2.frames import CANCEL, NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM
from wakeful.ingress.http2.rules import (
    malformed_answer,
    malformed_trailers,
)
from wakeful.ingress.http2.streams import CannotSend, StreamGone
from wakeful.ingress.http2.wire import BODY, TRAILERS, WINDOW, WireError
from wakeful.ingress.upstream.bases import Gated, tuned
from wakeful.ingress.upstream.closing import shut
from wakeful.ingress.upstream.h2exchange import H2Exchange

STREAM_WINDOW = 256 * 1024
"""Answer bytes one stream may have waiting for its client."""
CONNECTION_WINDOW = 16 * 1024 * 1024
"""...and one connection, over all its streams."""
MAX_STREAMS = 64
"""Streams this side opens on one connection at most, whatever the sandbox allows: as many as
the connection's window holds full streams (a client that reads nothing cannot stall the
others); the pool opens another connection past it."""
MAX_UNSENT = 4 * 1024 * 1024
"""What the ingress's writes to a sandbox may leave unread in its buffer. Requests' bodies
stop at the write gate's mark (`HIGH_WATER`, and what the writers of one turn queue is
bounded by it too: `_send_body`); past it only the frames that answer the sandbox's own
wait (a RST_STREAM for each DATA frame on a closed stream, acknowledgements), from a sandbox
that sends and reads nothing: its connection is cut (it grew by 180 MB in 8 s: a hostile
tester's find)."""
MAX_HEAD_BYTES = 64 * 1024
"""An answer's head or trailers, decoded, at most (an HPACK bomb from a sandbox)."""


class H2Upstream(Gated):
    """One h2c connection to a sandbox; many exchanges at once."""

    def __init__(self, pool: H2Pool) -> None:
        self._pool = pool
        self.loop = asyncio.get_running_loop()
        self._wire = ClientWire(MAX_HEAD_BYTES, STREAM_WINDOW)
        self.transport: asyncio.Transport | None = None
        self.exchanges: dict[int, H2Exchange] = {}
        self.closed = False
        self.going = False
        """GOAWAY came (or was sent): no new stream on it."""
        self._writable = WriteGate(self.loop)
        self._window: asyncio.Future[None] | None = None
        """What body writers wait on while the sandbox's windows are shut."""
        self._idle = Deadline(self.loop, self._idle_out)
        self._scan = FrameScan(MAX_HEAD_BYTES, preface=False)
        """Frame boundaries: a head's CONTINUATIONs bounded, the sandbox's GOAWAY taken out."""
        now = self.loop.time()
        self._control = Budget(CONTROL_BURST, CONTROL_RATE, now)
        self._resets = Budget(RESET_BURST, RESET_RATE, now)
        self._windows = Budget(CONTROL_BURST, CONTROL_RATE, now)
        """What a client's connection may send that carries no answer (`http2.budgets`), a
        sandbox's may too: past it the connection is cut (an app is untrusted code, and a
        flood of PINGs would hold the loop every app's requests share). What the ingress
        sends earns more, as a well-behaved peer answers it: a PING for each DATA or HEADERS
        frame (grpc-go's bandwidth probe), a WINDOW_UPDATE or two for each DATA frame, and
        a reset for each stream opened (Go ends a stream it answered early with one)."""
        self._flushing = False
        """A write is due this turn of the loop (`flush`)."""

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = tuned(transport)
        self._wire.initiate_connection()
        self._wire.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
        self.flush()

    def data_received(self, data: bytes) -> None:
        seen = self._scan.feed(data)
        if seen.refusal is not None:
            self._lost(UpstreamFailed(f"the sandbox sent {seen.refusal}"), unanswered=False)
            return
        now = self.loop.time()
        if (
            (seen.control and not self._control.spend(seen.control, now))
            or (seen.resets and not self._resets.spend(seen.resets, now))
            or (seen.windows and not self._windows.spend(seen.windows, now))
        ):
            flood = "too many frames that carry no answer (PING, SETTINGS, RST_STREAM, ...)"
            self._lost(UpstreamFailed(f"the sandbox sent {flood}"), unanswered=False)
            return
        if seen.goaway_last is not None:  # kept from the wire (the streams it names go on)
            self._going_away(seen.goaway_last)
        try:
            events = self._wire.receive(seen.data)
        except WireError as exc:  # it answered, badly: no stream is sent again
            self.write_out()  # the GOAWAY saying why
            self._lost(UpstreamFailed(f"the sandbox broke HTTP/2: {exc}"), unanswered=False)
            return
        if (stray := self._wire.take_stray()) and not self._control.spend(stray, now):
            flood = "the sandbox sent too many frames on streams already closed"
            self._lost(UpstreamFailed(flood), unanswered=False)
            return
        why: str | None
        for event in events:
            kind = event.kind
            if kind == WINDOW:
                self._open_window()
                continue
            found = self.exchanges.get(event.stream_id)
            if kind == BODY:
                if found is None:
                    self.consumed(event.stream_id, event.flow)
                    continue
                data = event.data
                padding = event.flow - len(data)
                if padding:
                    self.consumed(event.stream_id, padding)
                why = found.got_data(data, event.ended)
                if why is not None:  # its bytes, refused, are read all the same (the window)
                    self.consumed(event.stream_id, len(data))
                    self._malformed(found, why)
            elif found is None:
                continue
            elif kind == ANSWER:
                headers = event.headers or []
                why = malformed_answer(headers) or found.got_head(headers, event.ended)
                if why is not None:
                    self._malformed(found, why)
            elif kind == TRAILERS:
                headers = event.headers or []
                why = malformed_trailers(headers) or found.got_end(headers)
                if why is not None:
                    self._malformed(found, why)
            elif event.remote:  # RESET
                self._reset_by_sandbox(event.stream_id, event.code)
            else:  # the wire reset it for what the sandbox sent
                found.sandbox_done = True
                why = f"the sandbox broke HTTP/2 on the stream (error {event.code})"
                found.fail(UpstreamFailed(why))
        self.flush()

    def _malformed(self, exchange: H2Exchange, why: str) -> None:
        """The sandbox's answer on a stream breaks HTTP/2's rules (RFC 9113 §8.1.1): the
        stream's error, the connection's others go on."""
        self._reset(exchange.stream_id, PROTOCOL_ERROR)
        exchange.sandbox_done = True
        exchange.fail(UpstreamFailed(f"the sandbox's answer is malformed: {why}"))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._lost(UpstreamFailed(f"the sandbox closed the connection{reason}"))
        self._writable.fail(UpstreamFailed("the sandbox closed the connection"))

    # -- streams -------------------------------------------------------------------------

    def room(self) -> int:
        """Streams it can still open (0 while it goes away or is closed)."""
        if self.closed or self.going or self.transport is None:
            return 0
        return min(self._wire.room(), MAX_STREAMS - len(self.exchanges))

    def open(
        self,
        headers: list[tuple[bytes, bytes]],
        body: AsyncIterable[bytes] | None,
        idle: float,
    ) -> H2Exchange:
        """Start an exchange: its head now, its body by a task as the windows allow."""
        if self.closed or self.going:  # lost between its dial and its first use
            raise ClosedUnanswered("the connection to the sandbox closed before this request")
        try:
            stream_id = self._wire.open(headers, body is None)
        except (CannotSend, StreamGone) as exc:
            raise UpstreamFailed(f"the request could not be sent on HTTP/2: {exc}") from None
        exchange = H2Exchange(self, stream_id, idle, headers[0][1] == b"HEAD")
        self.exchanges[stream_id] = exchange
        self._idle.clear()
        self._control.give(1)
        self._resets.give(1)
        if body is not None:
            exchange._writer = self.loop.create_task(self._send_body(exchange, body))
        self.flush()  # after the writer's first step: a body already here goes in one write
        return exchange

    async def _send_body(self, exchange: H2Exchange, body: AsyncIterable[bytes]) -> None:
        conn = self._wire
        stream_id = exchange.stream_id
        try:
            async for chunk in body:
                view = memoryview(chunk)
                while view:
                    if exchange.closed or exchange._ended or self.closed:
                        return
                    if (closed := self._writable.waiting()) is not None:
                        await closed  # the transport is full
                        continue
                    if conn.pending() > HIGH_WATER:  # the gate closes only once written:
                        await asyncio.sleep(0)  # the writers of a turn queue one mark at most
                        continue
                    window = min(
                        conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size
                    )
                    if window <= 0:
                        await self._wait_window()
                        continue
                    conn.send_data(stream_id, bytes(view[:window]))
                    self._control.give(1)
                    self._windows.give(2)
                    view = view[window:]
                    self.flush()
            if not exchange.closed and not self.closed:
                conn.end_stream(stream_id)
                self.flush()
        except asyncio.CancelledError:
            raise
        except StreamGone:
            return  # the sandbox answered and ended the stream first: its answer stands
        except BaseException as exc:  # the client left mid-body, or the sandbox did
            if exchange.answered and isinstance(exc, UpstreamFailed):
                return
            exchange.fail(exc if isinstance(exc, Exception) else UpstreamFailed(str(exc)))
            self._reset(stream_id, CANCEL)

    async def _wait_window(self) -> None:
        if self._window is None or self._window.done():
            self._window = self.loop.create_future()
        await self._window

    def _open_window(self) -> None:
        if self._window is not None and not self._window.done():
            self._window.set_result(None)

    def consumed(self, stream_id: int, size: int) -> None:
        if self.closed:
            return
        self._wire.acknowledge(size, stream_id)
        self.flush()

    def finished(self, exchange: H2Exchange) -> None:
        """An exchange's client is done with it: reset the stream if it has not ended."""
        stream_id = exchange.stream_id
        if self.exchanges.pop(stream_id, None) is None:
            return
        unread = exchange.drop_unread()  # the client will not take it: its window comes back
        if unread:
            self.consumed(stream_id, unread)
        if not exchange.sandbox_done or stream_id in self._wire.streams:
            # the client left, the ingress timed it out, or the answer ended before the
            # request's body did (RFC 9113 §8.1: the sandbox need not read the rest)
            self._reset(stream_id, CANCEL)
            self.flush()
        if not self.exchanges:
            if self.going:
                self.close()
            else:
                self._idle.after(self._pool.keepalive)

    def _reset(self, stream_id: int, code: int) -> None:
        if self.closed:
            return
        with contextlib.suppress(StreamGone):
            self._wire.reset_stream(stream_id, code)

    def _reset_by_sandbox(self, stream_id: int, code: int) -> None:
        exchange = self.exchanges.get(stream_id)
        if exchange is None:
            return
        exchange.sandbox_done = True
        if code == REFUSED_STREAM and not exchange.answered:
            exchange.fail(ClosedUnanswered("the sandbox refused the stream unprocessed"))
        else:
            exchange.fail(UpstreamFailed(f"the sandbox reset the stream ({code!r})"))

    def _going_away(self, last_stream_id: int) -> None:
        """The sandbox's GOAWAY: no new stream on this connection; those it names carry on,
        newer ones were never processed (they may be sent again)."""
        self.going = True
        self._pool.forget(self)
        for stream_id, exchange in list(self.exchanges.items()):
            if stream_id > last_stream_id:
                exchange.sandbox_done = True
                exchange.fail(ClosedUnanswered("the sandbox went away before this stream"))
        if not self.exchanges:
            self.close()

    def _lost(self, exc: UpstreamFailed, unanswered: bool = True) -> None:
        """The connection is gone: its exchanges fail with `exc`, those with no answer yet
        with `ClosedUnanswered` when `unanswered` (it closed: they may be sent again)."""
        if self.closed:
            return
        self.closed = True
        self._idle.cancel()
        self._pool.forget(self)
        for exchange in list(self.exchanges.values()):
            exchange.sandbox_done = True
            if unanswered and not exchange.answered and not exchange._head.done():
                exchange.fail(ClosedUnanswered("the connection closed before any answer"))
            else:
                exchange.fail(exc)
        self._open_window()
        if self.transport is not None:
            self.transport.abort()

    def _idle_out(self) -> None:
        if not self.exchanges:
            self.close()

    def flush(self) -> None:
        """Write what the wire holds once this turn of the loop is over: a request's HEADERS, DATA
        and END_STREAM, and those of every stream that wrote meanwhile, in one write."""
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self.write_out)

    def write_out(self) -> None:
        self._flushing = False
        data = self._wire.data_to_send()
        transport = self.transport
        if data and transport is not None and not self.closed:
            transport.write(data)
            if transport.get_write_buffer_size() > MAX_UNSENT:
                why = f"the sandbox left {MAX_UNSENT} bytes of the ingress's unread"
                self._lost(UpstreamFailed(why), unanswered=False)

    def close(self) -> None:
        if self.closed:
            return
        self._wire.close_connection(NO_ERROR)
        self.write_out()
        self.closed = True
        self._idle.cancel()
        self._pool.forget(self)
        for exchange in list(self.exchanges.values()):
            exchange.fail(UpstreamFailed("the connection to the sandbox was closed"))
        self._open_window()
        if self.transport is not None:
            shut(self.transport)


class H2Pool:
    """The h2c connections to one sandbox address."""

    def __init__(self, keepalive: float) -> None:
        self.keepalive = keepalive
        self.conns: list[H2Upstream] = []
        self.dialing: asyncio.Future[None] | None = None
        """While a connection is being opened: what other exchanges wait on."""

    def take(self) -> H2Upstream | None:
        """The connection with the most streams in use that still has room (fewer, busier
        connections), or None."""
        best: H2Upstream | None = None
        for conn in self.conns:
            room = conn.room()
            if room > 0 and (best is None or room < best.room()):
                best = conn
        return best

    def forget(self, conn: H2Upstream) -> None:
        with contextlib.suppress(ValueError):
            self.conns.remove(conn)

    def close(self) -> None:
        for conn in list(self.conns):
            conn.close()


def request_headers(
    method: str, authority: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    """An HTTP/2 request head from what the proxy sends an HTTP/1.1 sandbox: the pseudo-fields
    first, `host` folded into `:authority`, and `te: trailers` (gRPC servers ask for it; the
    ingress passes trailers on)."""
    host = authority
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if name == b"host":
            host = value
        elif name not in _NOT_ON_H2:
            out.append((name, value))
    head = [
        (b":method", method.encode("latin-1")),
        (b":scheme", b"http"),
        (b":authority", host),
        (b":path", target),
    ]
    head.extend(out)
    head.append((b"te", b"trailers"))
    return head


_NOT_ON_H2 = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te"})
"""Connection-specific fields HTTP/2 forbids (RFC 9113 §8.2.2); the proxy drops them already,
this keeps a request HTTP/2 forbids from being sent."""
