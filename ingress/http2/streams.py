"""One client connection's HTTP/2 streams and what goes out on it, server side, sans-IO:
the state `http2.wire` reads frames into (each stream's two sides and windows, the
connection's windows, the closed streams remembered) and the sending the connection asks
for (`send_headers`, `send_data`, `end_stream`, `reset_stream`, `acknowledge`), queued as
bytes (`data_to_send`). `Wire` is a `Streams` that also reads."""

from __future__ import annotations

from typing import Final

from wakeful.ingress.http2.fields import FieldEncoder
from wakeful.ingress.http2.frames import (
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    ENABLE_CONNECT_PROTOCOL,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Window,
    frame,
    goaway_frame,
)

CLOSED_KEPT: Final = 1024
"""Closed streams whose end is remembered (by a reset or not), to answer a late frame on one
as RFC 9113 §5.1 asks; an older one counts as ended (`h2` keeps 65,536)."""


class StreamGone(Exception):
    """What was to be sent is for a stream that is closed (`h2`'s StreamClosedError)."""


class CannotSend(Exception):
    """What was to be sent breaks a rule of the stream: past its window, after its end."""


class Stream:
    __slots__ = ("heads", "inbound", "local_open", "remote_open", "sent")

    def __init__(self, inbound: int, outbound: int) -> None:
        self.inbound = Window(inbound)
        self.sent = outbound
        """What we may still send on it (its outbound window)."""
        self.remote_open = True
        """The client has not ended its side."""
        self.local_open = True
        """We have not ended ours."""
        self.heads = 0
        """Final (not 1xx) heads sent: a second is trailers."""


class Streams:
    """The streams of one connection and what is sent on them."""

    def __init__(self, max_streams: int, max_header_list_size: int, stream_window: int) -> None:
        self.encoder = FieldEncoder()
        self.local = [
            (HEADER_TABLE_SIZE, 4096),
            (ENABLE_PUSH, 0),
            (INITIAL_WINDOW_SIZE, stream_window),
            (MAX_FRAME_SIZE, DEFAULT_FRAME),
            (ENABLE_CONNECT_PROTOCOL, 0),
            (MAX_CONCURRENT_STREAMS, max_streams),
            (MAX_HEADER_LIST_SIZE, max_header_list_size),
        ]
        """What we advertise, in `h2`'s order."""
        self.inbound_initial = max(stream_window, DEFAULT_WINDOW)
        """A new stream's inbound window: until our SETTINGS are acknowledged, the larger of
        ours and the default (what the client may have sent before it read ours is taken)."""
        self.outbound_initial = DEFAULT_WINDOW
        self.max_outbound_frame_size = DEFAULT_FRAME
        self.inbound = Window(DEFAULT_WINDOW)
        self.sent = DEFAULT_WINDOW
        """What we may still send on the connection (its outbound window)."""
        self.streams: dict[int, Stream] = {}
        self._closed: dict[int, bool] = {}
        """Streams closed lately: True if by a reset (a late frame on one is expected)."""
        self.highest_inbound_stream_id = 0
        self._out = bytearray()
        self.named_last: int | None = None
        """The last stream a graceful GOAWAY (the connection's own) named."""
        self.ended = False
        """Our GOAWAY for a connection error went (`close_connection`): nothing more is sent."""
        self._stray = 0
        """Empty DATA frames and HEADERS on streams already closed (and, on the client's side,
        1xx heads) since `take_stray`: they
        carry no request, take no window, and are answered (RST_STREAM), so the connection
        budgets them. DATA with bytes is bounded by the windows (a client's DATA in flight
        when the ingress reset its stream is not counted)."""

    # -- out -----------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def pending(self) -> int:
        """Bytes queued, not yet taken by `data_to_send`."""
        return len(self._out)

    def initiate_connection(self) -> None:
        payload = b"".join(
            code.to_bytes(2, "big") + value.to_bytes(4, "big") for code, value in self.local
        )
        self._out += frame(SETTINGS, 0, 0, payload)

    def increment_flow_control_window(self, increment: int) -> None:
        """Open the connection's window by `increment` (what `h2`'s did, for the connection)."""
        self.inbound.opened(increment)
        self._out += frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))

    def local_flow_control_window(self, stream_id: int) -> int:
        stream = self.streams.get(stream_id)
        if stream is None or self.ended:
            raise StreamGone(f"stream {stream_id} is closed")
        return min(self.sent, stream.sent)

    def send_headers(
        self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False
    ) -> None:
        stream = self._sending(stream_id)
        informational = False
        for name, value in headers:
            if name == b":status":
                informational = value[:1] == b"1"
                break
        if informational:
            if end_stream:
                raise CannotSend("an informational answer cannot end its stream")
        else:
            stream.heads += 1
            if stream.heads > 1 and not end_stream:
                raise CannotSend("trailers must end the stream")
        block = self.encoder.encode(headers)
        size = self.max_outbound_frame_size
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            self._out += frame(HEADERS, flags | END_HEADERS, stream_id, block)
        else:
            self._out += frame(HEADERS, flags, stream_id, block[:size])
            at = size
            while at < len(block):
                last = at + size >= len(block)
                piece = block[at : at + size]
                self._out += frame(CONTINUATION, END_HEADERS if last else 0, stream_id, piece)
                at += size
        if end_stream:
            self._local_end(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        stream = self._sending(stream_id)
        size = len(data)
        if size > 0 and size > min(self.sent, stream.sent):
            raise CannotSend(f"cannot send {size} bytes past the window")
        if size > self.max_outbound_frame_size:
            raise CannotSend(f"cannot send a frame of {size} bytes")
        self._out += frame(DATA, END_STREAM if end_stream else 0, stream_id, data)
        self.sent -= size
        stream.sent -= size
        if end_stream:
            self._local_end(stream_id, stream)

    def end_stream(self, stream_id: int) -> None:
        stream = self._sending(stream_id)
        self._out += frame(DATA, END_STREAM, stream_id, b"")
        self._local_end(stream_id, stream)

    def reset_stream(self, stream_id: int, code: int) -> None:
        if stream_id not in self.streams or self.ended:
            raise StreamGone(f"stream {stream_id} is closed")
        self._out += frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))
        self._close(stream_id, True)

    def acknowledge(self, size: int, stream_id: int) -> None:
        """The connection read `size` bytes of a stream's body (or dropped them): the client
        may send as many more, told when `Window` says so."""
        if self.ended:
            return
        increment = self.inbound.processed_bytes(size)
        if increment:
            self._out += frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))
        stream = self.streams.get(stream_id)
        if stream is not None:
            increment = stream.inbound.processed_bytes(size)
            if increment:
                self._out += frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))

    def take_stray(self) -> int:
        stray, self._stray = self._stray, 0
        return stray

    def close_connection(self, code: int, debug: bytes = b"") -> None:
        """GOAWAY for a connection error, naming the highest stream opened (or what a
        graceful GOAWAY named, `named_last`, if lower: RFC 9113 §6.8): the last frame sent
        (after it, sends raise StreamGone, and acknowledgements are dropped)."""
        if not self.ended:
            named = self.highest_inbound_stream_id
            if self.named_last is not None:
                named = min(named, self.named_last)
            self._out += goaway_frame(named, code, debug)
            self.ended = True

    def _sending(self, stream_id: int) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None or self.ended:
            raise StreamGone(f"stream {stream_id} is closed")
        if not stream.local_open:
            raise CannotSend(f"stream {stream_id} was ended")
        return stream

    def _local_end(self, stream_id: int, stream: Stream) -> None:
        stream.local_open = False
        if not stream.remote_open:
            self._close(stream_id, False)

    def _close(self, stream_id: int, reset: bool) -> None:
        del self.streams[stream_id]
        closed = self._closed
        closed[stream_id] = reset
        if len(closed) > CLOSED_KEPT:
            del closed[next(iter(closed))]
