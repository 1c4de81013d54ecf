"""One client connection's HTTP/2 frames and stream states (RFC 9113), server side, sans-IO,
compiled: what `h2` did for `H2Connection`. `h2` and `hyperframe`, pure Python, were half an
HTTP/2 request's CPU once HPACK and the header rules were the ingress's own (docs/design/
http2.md, "The framing, compiled"). This does their work for the configuration the ingress
uses: a server that never pushes, its HPACK `http2.fields`, its header rules `http2.rules`
(`http2.client`: the same, the roles turned).

It does what `h2` does, rule for rule, and `tests/ingress/http2/test_wire.py` holds it to `h2`
over real clients' traffic (the same events, the same bytes out) and over hostile frame
sequences (the same verdict). Where `h2` was stricter than RFC 9113, or answered otherwise,
this follows the RFC, each named where it is done (the test names them all):

- a frame past the advertised frame size is refused from its header, not once all of it came;
- malformed trailers (without END_STREAM), a WINDOW_UPDATE of 0 on a stream, and a PRIORITY
  on its own stream are stream errors (RST_STREAM) where `h2` ended the connection;
- a header block HPACK cannot decode is COMPRESSION_ERROR (`h2`: PROTOCOL_ERROR).

Where `h2` was more lenient than the RFC this keeps it so (a RST_STREAM on an idle stream
ignored; DATA on a closed stream answered with RST_STREAM, whoever closed it); the frames on
closed streams are counted (`take_stray`) for the connection's budget.

What a client may hold is bounded by `http2.budgets` before this sees the bytes and by the
windows here; a stream past MAX_CONCURRENT_STREAMS is `H2Connection._request`'s to refuse.
"""

from __future__ import annotations

from typing import Final

from hpack.exceptions import HPACKError, OversizedHeaderListError

from wakeful.ingress.http2.fields import FieldDecoder
from wakeful.ingress.http2.frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    ENABLE_CONNECT_PROTOCOL,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Fault,
    frame,
    u32,
)
from wakeful.ingress.http2.streams import Stream, Streams

# What an event is (`Event.kind`).
REQUEST: Final = 1
"""A request's head: `headers`, and `ended` if it has no body."""
BODY: Final = 2
"""Body bytes: `data`, `flow` (what they took of the windows, padding included), `ended`."""
TRAILERS: Final = 3
"""The request's trailers (`headers`); the stream's side ended."""
RESET: Final = 4
"""The stream is over: reset by the client (`remote`) or by the rules here for what the
client sent (`code`, a RST_STREAM already queued)."""
WINDOW: Final = 5
"""The client opened a window: a stream's, or the connection's (`stream_id` 0, also after
any SETTINGS, which may change every stream's)."""


class WireError(Exception):
    """A connection error (RFC 9113 §5.4.1): the GOAWAY with `code` is queued already."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Event:
    __slots__ = ("code", "data", "ended", "flow", "headers", "kind", "remote", "stream_id")

    def __init__(
        self,
        kind: int,
        stream_id: int,
        headers: list[tuple[bytes, bytes]] | None = None,
        data: bytes = b"",
        flow: int = 0,
        ended: bool = False,
        remote: bool = False,
        code: int = 0,
    ) -> None:
        self.kind = kind
        self.stream_id = stream_id
        self.headers = headers
        self.data = data
        self.flow = flow
        self.ended = ended
        self.remote = remote
        self.code = code

    def __repr__(self) -> str:  # (headers, data, flow, ended, remote, code)
        rest = (self.headers, self.data, self.flow, self.ended, self.remote, self.code)
        return f"Event({self.kind}, {self.stream_id}, {rest!r})"


class Wire(Streams):
    """The connection's state: feed it what the client sent (`receive`), tell it what to send
    (`send_headers`, `send_data`, `end_stream`, `reset_stream`, `acknowledge`), write what
    `data_to_send` gives."""

    def __init__(self, max_streams: int, max_header_list_size: int, stream_window: int) -> None:
        super().__init__(max_streams, max_header_list_size, stream_window)
        self.decoder = FieldDecoder(max_header_list_size)
        self._window_to_ack = stream_window
        """Our INITIAL_WINDOW_SIZE, in force once the client acknowledges our SETTINGS (-1:
        it has)."""
        self.max_inbound_frame_size = DEFAULT_FRAME
        self._preface = len(PREFACE)
        """Preface bytes still to come."""
        self._pending = b""
        """The start of a frame not whole yet."""
        self._block = bytearray()
        self._block_id = 0
        """The stream of a header block waiting for its CONTINUATION frames (0: none)."""
        self._block_flags = 0
        self._block_weight = b""
        """The block's HEADERS frame's priority fields (5 bytes, or none)."""
        self.peer_max_streams = 2**32 + 1
        """The peer's MAX_CONCURRENT_STREAMS (`h2`'s default until it says: no bound)."""
        self.peer_is_server = False
        """The client's side (`http2.client`): the peer may not enable push (§6.5.2)."""

    # -- in ------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """The events what the client sent makes; WireError for a connection error (its
        GOAWAY queued; the events of the frames before it are dropped, as `h2` did)."""
        try:
            return self._receive(data)
        except Fault as fault:
            self.close_connection(fault.code)
            raise WireError(fault.code, str(fault)) from None

    def _receive(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if self.ended:
            return events  # after our GOAWAY for an error, nothing is read
        if self._preface:
            taken = min(self._preface, len(data))
            start = len(PREFACE) - self._preface
            if data[:taken] != PREFACE[start : start + taken]:
                raise Fault(PROTOCOL_ERROR, "invalid HTTP/2 preamble")
            self._preface -= taken
            data = data[taken:]
        if self._pending:
            data = self._pending + data
            self._pending = b""
        at = 0
        end = len(data)
        while end - at >= 9:
            length = (data[at] << 16) | (data[at + 1] << 8) | data[at + 2]
            if length > self.max_inbound_frame_size:
                raise Fault(
                    FRAME_SIZE_ERROR,
                    f"a frame of {length} bytes, past {self.max_inbound_frame_size}",
                )
            if end - at - 9 < length:
                break
            kind = data[at + 3]
            flags = data[at + 4]
            stream_id = u32(data, at + 5) & 0x7FFFFFFF
            payload = data[at + 9 : at + 9 + length]
            at += 9 + length
            if self._block_id:
                if kind != CONTINUATION or stream_id != self._block_id:
                    raise Fault(PROTOCOL_ERROR, "a frame inside a header block")
                self._block += payload
                if flags & END_HEADERS:
                    self._headers(events)
                continue
            if kind == DATA:
                self._data(events, flags, stream_id, payload)
            elif kind == HEADERS:
                self._headers_frame(events, flags, stream_id, payload)
            elif kind == PRIORITY:
                self._priority(events, stream_id, payload)
            elif kind == RST_STREAM:
                self._rst(events, stream_id, payload)
            elif kind == SETTINGS:
                self._settings(events, flags, stream_id, payload)
            elif kind == PUSH_PROMISE:
                raise Fault(PROTOCOL_ERROR, "PUSH_PROMISE, push not enabled")
            elif kind == PING:
                if stream_id:
                    raise Fault(PROTOCOL_ERROR, "PING on a stream")
                if length != 8:
                    raise Fault(FRAME_SIZE_ERROR, "PING not of 8 bytes")
                if not flags & ACK:
                    self._out += frame(PING, ACK, 0, payload)
            elif kind == GOAWAY:
                if stream_id:
                    raise Fault(PROTOCOL_ERROR, "GOAWAY on a stream")
                if length < 8:
                    raise Fault(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            elif kind == WINDOW_UPDATE:
                self._window_update(events, stream_id, payload)
            elif kind == CONTINUATION:
                raise Fault(PROTOCOL_ERROR, "CONTINUATION outside a header block")
            # any other type is ignored (§5.5)
        if at < end:
            self._pending = data[at:]
        return events

    def _unpad(self, flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload:
            raise Fault(FRAME_SIZE_ERROR, "a padded frame without its pad length")
        pad = payload[0]
        if pad > len(payload) - 1:
            raise Fault(PROTOCOL_ERROR, "padding past the frame")
        return payload[1 : len(payload) - pad]

    def _data(self, events: list[Event], flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise Fault(PROTOCOL_ERROR, "DATA on stream 0")
        data = self._unpad(flags, payload)
        flow = len(payload)
        self.inbound.consumed(flow)
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open:
            if stream is None and self._idle(stream_id):
                raise Fault(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if not flow:  # what takes no window is bounded by no window: counted
                self._stray += 1
            increment = self.inbound.processed_bytes(flow)  # read away, as `h2` did
            if increment:
                self._out += frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))
            self._out += frame(RST_STREAM, 0, stream_id, STREAM_CLOSED.to_bytes(4, "big"))
            if stream is not None:  # half-closed (remote): a stream error (§5.1)
                self._close(stream_id, True)
                events.append(Event(RESET, stream_id, code=STREAM_CLOSED))
            return
        stream.inbound.consumed(flow)
        ended = bool(flags & END_STREAM)
        events.append(Event(BODY, stream_id, data=data, flow=flow, ended=ended))
        if ended:
            self._remote_end(stream_id, stream)

    def _headers_frame(
        self, events: list[Event], flags: int, stream_id: int, payload: bytes
    ) -> None:
        if not stream_id:
            raise Fault(PROTOCOL_ERROR, "HEADERS on stream 0")
        body = self._unpad(flags, payload)
        weight = b""
        if flags & PRIORITY_FLAG:
            if len(body) < 5:  # padding into the priority fields is PROTOCOL_ERROR (§6.2)
                code = PROTOCOL_ERROR if flags & PADDED and len(payload) >= 6 else FRAME_SIZE_ERROR
                raise Fault(code, "HEADERS too short for its priority")
            weight, body = body[:5], body[5:]
        self._block_id = stream_id
        self._block_flags = flags
        self._block_weight = weight
        self._block = bytearray(body)
        if flags & END_HEADERS:
            self._headers(events)

    def _headers(self, events: list[Event]) -> None:
        """A whole header block: decoded first, whatever its stream (HPACK's table is the
        connection's), then a request, trailers, or a stream error."""
        stream_id = self._block_id
        flags = self._block_flags
        weight = self._block_weight
        block = bytes(self._block)
        self._block_id = 0
        self._block = bytearray()
        try:
            fields = self.decoder.decode(block)
        except OversizedHeaderListError as exc:
            raise Fault(ENHANCE_YOUR_CALM, f"oversized header block: {exc}") from None
        except (HPACKError, IndexError, TypeError, UnicodeDecodeError) as exc:
            raise Fault(COMPRESSION_ERROR, f"error decoding a header block: {exc}") from None
        self._fields(events, stream_id, flags, weight, fields)

    def _fields(
        self,
        events: list[Event],
        stream_id: int,
        flags: int,
        weight: bytes,
        fields: list[tuple[bytes, bytes]],
    ) -> None:
        """A decoded header block on `stream_id`: a request, trailers, or a stream error (the
        client's side, `http2.client`, reads answers)."""
        ended = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id % 2 == 0:
                raise Fault(PROTOCOL_ERROR, f"stream {stream_id} is not the client's to open")
            if stream_id <= self.highest_inbound_stream_id:
                closed = self._closed.get(stream_id)
                if closed is None:  # skipped, or closed too long ago (§5.1.1)
                    raise Fault(PROTOCOL_ERROR, f"stream {stream_id} below the highest opened")
                if closed:  # after a reset: expected, refused
                    self._stray += 1
                    self._out += frame(RST_STREAM, 0, stream_id, STREAM_CLOSED.to_bytes(4, "big"))
                    return
                raise Fault(STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
            self.highest_inbound_stream_id = stream_id
            stream = Stream(self.inbound_initial, self.outbound_initial)
            self.streams[stream_id] = stream
            if weight and u32(weight, 0) & 0x7FFFFFFF == stream_id:
                self._provoked(events, stream_id, PROTOCOL_ERROR)  # RFC 9113 §5.3.1
                return
            events.append(Event(REQUEST, stream_id, headers=fields, ended=ended))
            if ended:
                stream.remote_open = False
            return
        if not stream.remote_open:  # half-closed (remote): a stream error (§5.1)
            self._provoked(events, stream_id, STREAM_CLOSED)
        elif weight and u32(weight, 0) & 0x7FFFFFFF == stream_id:
            self._provoked(events, stream_id, PROTOCOL_ERROR)  # RFC 9113 §5.3.1
        elif not ended:  # trailers must end it (§8.1): malformed, a stream error
            self._provoked(events, stream_id, PROTOCOL_ERROR)
        else:
            events.append(Event(TRAILERS, stream_id, headers=fields, ended=True))
            self._remote_end(stream_id, stream)

    def _priority(self, events: list[Event], stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise Fault(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise Fault(FRAME_SIZE_ERROR, "PRIORITY not of 5 bytes")
        if u32(payload, 0) & 0x7FFFFFFF == stream_id and stream_id in self.streams:
            self._provoked(events, stream_id, PROTOCOL_ERROR)  # §5.3.1; idle: ignored

    def _rst(self, events: list[Event], stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise Fault(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise Fault(FRAME_SIZE_ERROR, "RST_STREAM not of 4 bytes")
        if stream_id in self.streams:  # on a stream not open: ignored, as `h2` does
            self._close(stream_id, True)
            events.append(Event(RESET, stream_id, remote=True, code=u32(payload, 0)))

    def _settings(self, events: list[Event], flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise Fault(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise Fault(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            if self._window_to_ack >= 0:  # ours are in force now
                delta = self._window_to_ack - self.inbound_initial
                self.inbound_initial = self._window_to_ack
                self._window_to_ack = -1
                for stream in self.streams.values():
                    largest = stream.inbound.largest + delta
                    stream.inbound.opened(delta)
                    stream.inbound.largest = largest
            return
        if len(payload) % 6:
            raise Fault(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        window = -1
        """The frame's last INITIAL_WINDOW_SIZE (as `h2` read it): the streams' windows move
        once a frame, not once an entry (2,730 entries over 64 streams: a hostile find)."""
        for at in range(0, len(payload), 6):
            code = (payload[at] << 8) | payload[at + 1]
            value = u32(payload, at + 2)
            if code in (ENABLE_PUSH, ENABLE_CONNECT_PROTOCOL):
                if value > 1 or (value and code == ENABLE_PUSH and self.peer_is_server):
                    raise Fault(PROTOCOL_ERROR, f"setting {code} must be 0 or 1, not {value}")
            elif code == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise Fault(FLOW_CONTROL_ERROR, f"an initial window of {value}")
                window = value
            elif code == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= MAX_FRAME:
                    raise Fault(PROTOCOL_ERROR, f"a max frame size of {value}")
                self.max_outbound_frame_size = value
            elif code == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
            elif code == MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        if window >= 0:
            delta = window - self.outbound_initial
            self.outbound_initial = window
            for stream in self.streams.values():
                stream.sent += delta
                if stream.sent > MAX_WINDOW:
                    raise Fault(FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
        self._out += frame(SETTINGS, ACK, 0, b"")
        events.append(Event(WINDOW, 0))

    def _window_update(self, events: list[Event], stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise Fault(FRAME_SIZE_ERROR, "WINDOW_UPDATE not of 4 bytes")
        increment = u32(payload, 0) & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise Fault(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.sent += increment
            if self.sent > MAX_WINDOW:
                raise Fault(FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
            events.append(Event(WINDOW, 0))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise Fault(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # closed: ignored
        if not increment:  # a stream error (§6.9)
            self._provoked(events, stream_id, PROTOCOL_ERROR)
            return
        stream.sent += increment
        if stream.sent > MAX_WINDOW:
            self._provoked(events, stream_id, FLOW_CONTROL_ERROR)
            return
        events.append(Event(WINDOW, stream_id))

    def _idle(self, stream_id: int) -> bool:
        """A stream never opened: the client's (odd) above the highest, or any of ours."""
        return stream_id % 2 == 0 or stream_id > self.highest_inbound_stream_id

    def _provoked(self, events: list[Event], stream_id: int, code: int) -> None:
        """A stream error for what the client sent: RST_STREAM, the stream closed."""
        self._out += frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))
        self._close(stream_id, True)
        events.append(Event(RESET, stream_id, code=code))

    def _remote_end(self, stream_id: int, stream: Stream) -> None:
        stream.remote_open = False
        if not stream.local_open:
            self._close(stream_id, False)
