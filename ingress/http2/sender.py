"""The way out of one HTTP/2 client connection: frames written once a turn of the loop,
each stream's DATA as the windows allow, and the handlers waiting for room.

`StreamResponder` (`http2.stream`) writes through it; `H2Connection` owns it and tells it when
the transport fills or empties (`paused`, `resumed`) and when it is gone (`lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from wakeful.aio.flow import WriteGate
from wakeful.ingress.errors import ClientGone
from wakeful.ingress.http2.frames import INTERNAL_ERROR
from wakeful.ingress.http2.streams import CannotSend, StreamGone, Streams

if TYPE_CHECKING:
    from wakeful.ingress.http2.stream import StreamResponder

log = logging.getLogger(__name__)


class Sender:
    def __init__(self, conn: Streams, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """`timeout`: how long `drain` waits for a client to take what it was sent."""
        self._wire = conn
        self._loop = loop
        self._timeout = timeout
        self.transport: asyncio.Transport | None = None
        self.gone = False
        self._waiters: dict[StreamResponder, asyncio.Future[None]] = {}
        """Handlers waiting in `drain` for their stream's window."""
        self._dirty: dict[int, StreamResponder] = {}
        """Streams written to since the last write out (`later`)."""
        self._flushing = False
        """A write out is due this turn of the loop (`flush`)."""
        self._gate = WriteGate(loop)
        self.writes_paused = False
        self._data_frames = 0
        """DATA frames sent since `take_data_frames` (what earns the client WINDOW_UPDATEs)."""

    def take_data_frames(self) -> int:
        sent, self._data_frames = self._data_frames, 0
        return sent

    def paused(self) -> None:
        self.writes_paused = True
        self._gate.close()

    def resumed(self) -> None:
        self.writes_paused = False
        self._gate.open()

    def lost(self) -> None:
        self.gone = True
        self._gate.open()

    def reset(self, stream_id: int, out: StreamResponder | None, code: int) -> None:
        """Reset a stream: nothing more of its answer goes out."""
        if out is not None:
            out.closed = True
            out.pending.clear()
            out.pending_bytes = 0
        if self.gone:
            return
        with contextlib.suppress(StreamGone):
            self._wire.reset_stream(stream_id, code)

    def send_head(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        if self.gone:
            return
        try:
            self._wire.send_headers(stream_id, headers, end_stream=end)
        except StreamGone:
            pass
        except CannotSend as exc:
            log.warning("an answer's head could not be sent on HTTP/2: %s", exc)
            self.reset(stream_id, None, INTERNAL_ERROR)
        if not end and not self.gone:
            return
        self.flush()

    def pump(self, stream_id: int, out: StreamResponder) -> None:
        """Send what `out` has pending as far as the windows allow; end the stream once all
        is sent and the handler ended it (the last DATA frame carries END_STREAM)."""
        conn = self._wire
        if self.gone or out.closed:
            out.pending.clear()
            out.pending_bytes = 0
            return
        if self.writes_paused:
            return  # the transport is full: it waits in `pending` (`resumed` pumps it)
        pending = out.pending
        try:
            while pending:
                window = conn.local_flow_control_window(stream_id)
                window = min(window, conn.max_outbound_frame_size)
                if window <= 0:
                    break
                chunk = pending[0]
                if len(chunk) <= window:
                    pending.popleft()
                    out.pending_bytes -= len(chunk)
                    last = not pending and out.ending is not None and not out.ending
                    conn.send_data(stream_id, chunk, end_stream=last)
                    self._data_frames += 1
                    if last:
                        out.ending = None
                        out.closed = True
                else:
                    pending[0] = chunk[window:]
                    out.pending_bytes -= window
                    conn.send_data(stream_id, chunk[:window])
                    self._data_frames += 1
            if not pending and out.ending is not None:
                trailers, out.ending = out.ending, None
                if trailers:
                    conn.send_headers(stream_id, list(trailers), end_stream=True)
                else:
                    conn.end_stream(stream_id)
                out.closed = True
        except StreamGone:
            out.closed = True
            pending.clear()
            out.pending_bytes = 0
        except CannotSend as exc:
            log.warning("an answer could not be sent on HTTP/2: %s", exc)
            self.reset(stream_id, out, INTERNAL_ERROR)
        self.flush()
        if (out.closed or not pending) and out.ending is None:
            self._wake(out)

    def later(self, stream_id: int, out: StreamResponder) -> None:
        """Pump `out` when the connection next writes (`flush`): what the handler writes and
        ends in one step goes out as one DATA frame with END_STREAM, and the answers of many
        streams in one write."""
        self._dirty[stream_id] = out
        self.flush()

    def pump_all(self, outs: Iterable[StreamResponder]) -> None:
        """The windows opened: send what waited for them."""
        for out in list(outs):
            if out.pending or out.ending is not None:
                self.pump(out.stream_id, out)

    def _wake(self, out: StreamResponder) -> None:
        waiter = self._waiters.pop(out, None) if self._waiters else None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self, out: StreamResponder) -> None:
        """Wait until `out`'s pending bytes are sent and the transport has room, at most the
        client's timeout (TimeoutError)."""
        if out.stream_id in self._dirty:
            del self._dirty[out.stream_id]
            self.pump(out.stream_id, out)
        if (out.closed or (not out.pending and out.ending is None)) and not self.writes_paused:
            if self.gone:
                raise ClientGone("the client hung up")
            return  # nothing to wait for: no timer (most answers end here)
        async with asyncio.timeout(self._timeout):
            while (out.pending or out.ending is not None) and not out.closed:
                if self.gone:
                    raise ClientGone("the client hung up")
                waiter = self._loop.create_future()
                self._waiters[out] = waiter
                await waiter
            if (gate := self._gate.waiting()) is not None:
                await asyncio.shield(gate)
        if self.gone:
            raise ClientGone("the client hung up")

    def flush(self) -> None:
        """Write what the wire holds once this turn of the loop is over: the frames of every stream
        that wrote meanwhile go out in one write."""
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self.write_out)

    def write_out(self) -> None:
        """Write what the wire holds now (a connection about to close cannot wait)."""
        self._flushing = False
        dirty = self._dirty
        while dirty:
            stream_id, out = dirty.popitem()
            self.pump(stream_id, out)
        data = self._wire.data_to_send()
        if data and self.transport is not None and not self.gone:
            self.transport.write(data)
