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
  h2c app they count streams, not connections.
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

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from wakeful.aio.deadline import Deadline
from wakeful.aio.flow import WriteGate
from wakeful.ingress.errors import ClosedUnanswered, UpstreamFailed
from wakeful.ingress.http2.fields import fit
from wakeful.ingress.http2.rules import (
    CONTROL_BURST,
    CONTROL_RATE,
    RESET_BURST,
    RESET_RATE,
    Budget,
    FrameScan,
)
from wakeful.ingress.upstream.closing import shut
from wakeful.ingress.upstream.connection import Gated, tuned
from wakeful.ingress.upstream.h2exchange import H2Exchange

STREAM_WINDOW = 256 * 1024
"""Answer bytes one stream may have waiting for its client."""
CONNECTION_WINDOW = 16 * 1024 * 1024
"""...and one connection, over all its streams."""
MAX_STREAMS = 64
"""Streams this side opens on one connection at most, whatever the sandbox allows: as many as
the connection's window holds full streams (a client that reads nothing cannot stall the
others); the pool opens another connection past it."""
MAX_HEAD_BYTES = 64 * 1024
"""An answer's head or trailers, decoded, at most (an HPACK bomb from a sandbox)."""

_CANCEL = h2.errors.ErrorCodes.CANCEL
_REFUSED = h2.errors.ErrorCodes.REFUSED_STREAM


class H2Upstream(Gated):
    """One h2c connection to a sandbox; many exchanges at once."""

    def __init__(self, pool: H2Pool) -> None:
        self._pool = pool
        self.loop = asyncio.get_running_loop()
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config)
        self._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEAD_BYTES,
            },
        )
        fit(self._h2, MAX_HEAD_BYTES)
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
        """What a client's connection may send that carries no answer (`http2.rules`), a
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
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
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
            why = "too many PING, SETTINGS, PRIORITY, WINDOW_UPDATE or RST_STREAM frames"
            self._lost(UpstreamFailed(f"the sandbox sent {why}"), unanswered=False)
            return
        if seen.goaway_last is not None:  # kept from h2, which would end the streams under way
            self._going_away(seen.goaway_last)
        try:
            events = self._h2.receive_data(seen.data)
        except h2.exceptions.ProtocolError as exc:  # it answered, badly: no stream is sent again
            self._lost(UpstreamFailed(f"the sandbox broke HTTP/2: {exc}"), unanswered=False)
            return
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                if (found := self.exchanges.get(event.stream_id)) is not None:
                    found.got_head(list(event.headers))
            elif isinstance(event, h2.events.DataReceived):
                found = self.exchanges.get(event.stream_id)
                if found is None:
                    self.consumed(event.stream_id, event.flow_controlled_length)
                    continue
                data = event.data or b""
                padding = event.flow_controlled_length - len(data)
                if padding:
                    self.consumed(event.stream_id, padding)
                if data:
                    found.got_data(data)
            elif isinstance(event, h2.events.TrailersReceived):
                if (found := self.exchanges.get(event.stream_id)) is not None:
                    found.got_end(list(event.headers))
            elif isinstance(event, h2.events.StreamEnded):
                if (found := self.exchanges.get(event.stream_id)) is not None:
                    if not found.answered:
                        found.fail(UpstreamFailed("the sandbox ended a stream with no answer"))
                    found.got_end()
            elif isinstance(event, h2.events.StreamReset):
                self._reset_by_sandbox(event.stream_id, event.error_code)
            elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                self._open_window()
        self.flush()

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
        allowed = min(self._h2.remote_settings.max_concurrent_streams, MAX_STREAMS)
        return allowed - len(self.exchanges)

    def open(
        self,
        headers: list[tuple[bytes, bytes]],
        body: AsyncIterable[bytes] | None,
        idle: float,
    ) -> H2Exchange:
        """Start an exchange: its head now, its body by a task as the windows allow."""
        if self.closed or self.going:  # lost between its dial and its first use
            raise ClosedUnanswered("the connection to the sandbox closed before this request")
        stream_id = self._h2.get_next_available_stream_id()
        exchange = H2Exchange(self, stream_id, idle)
        self.exchanges[stream_id] = exchange
        self._idle.clear()
        try:
            self._h2.send_headers(stream_id, headers, end_stream=body is None)
        except h2.exceptions.ProtocolError as exc:
            del self.exchanges[stream_id]
            raise UpstreamFailed(f"the request could not be sent on HTTP/2: {exc}") from None
        self._control.give(1)
        self._resets.give(1)
        self.flush()
        if body is not None:
            exchange._writer = self.loop.create_task(self._send_body(exchange, body))
        return exchange

    async def _send_body(self, exchange: H2Exchange, body: AsyncIterable[bytes]) -> None:
        conn = self._h2
        stream_id = exchange.stream_id
        try:
            async for chunk in body:
                view = memoryview(chunk)
                while view:
                    if exchange.closed or exchange._ended or self.closed:
                        return
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
                    if (closed := self._writable.waiting()) is not None:
                        await closed
            if not exchange.closed and not self.closed:
                conn.end_stream(stream_id)
                self.flush()
        except asyncio.CancelledError:
            raise
        except h2.exceptions.StreamClosedError:
            return  # the sandbox answered and ended the stream first: its answer stands
        except BaseException as exc:  # the client left mid-body, or the sandbox did
            if exchange.answered and isinstance(exc, UpstreamFailed):
                return
            exchange.fail(exc if isinstance(exc, Exception) else UpstreamFailed(str(exc)))
            self._reset(stream_id, _CANCEL)

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
        with contextlib.suppress(h2.exceptions.StreamClosedError, KeyError):
            self._h2.acknowledge_received_data(size, stream_id)
        self.flush()

    def finished(self, exchange: H2Exchange) -> None:
        """An exchange's client is done with it: reset the stream if it has not ended."""
        stream_id = exchange.stream_id
        if self.exchanges.pop(stream_id, None) is None:
            return
        unread = exchange.drop_unread()  # the client will not take it: its window comes back
        if unread:
            self.consumed(stream_id, unread)
        if not exchange.sandbox_done:  # the client left, or the ingress timed it out
            self._reset(stream_id, _CANCEL)
            self.flush()
        if not self.exchanges:
            if self.going:
                self.close()
            else:
                self._idle.after(self._pool.keepalive)

    def _reset(self, stream_id: int, code: int) -> None:
        if self.closed:
            return
        with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self._h2.reset_stream(stream_id, code)

    def _reset_by_sandbox(self, stream_id: int, code: int) -> None:
        exchange = self.exchanges.get(stream_id)
        if exchange is None:
            return
        exchange.sandbox_done = True
        if code == _REFUSED and not exchange.answered:
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
        """Write what h2 holds once this turn of the loop is over: a request's HEADERS, DATA
        and END_STREAM, and those of every stream that wrote meanwhile, in one write."""
        if not self._flushing:
            self._flushing = True
            self.loop.call_soon(self.write_out)

    def write_out(self) -> None:
        self._flushing = False
        data = self._h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if self.closed:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.close_connection()
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
this keeps a request h2 would refuse from being sent."""
