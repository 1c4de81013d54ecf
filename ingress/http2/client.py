"""The client's side of `http2.wire`: an h2c connection the ingress opens to a sandbox
(`upstream.h2c`, gRPC), sans-IO, compiled with it, in place of `h2`'s client.

It is `Wire` with the roles turned: the ingress sends the preface and opens the streams
(odd ids, at most the sandbox's MAX_CONCURRENT_STREAMS at once, `open`), and a header block
on a stream is an answer: heads of 1xx skipped, the final head (`ANSWER`), then trailers.
The framing, the windows, the resets and the budgets' counts are `Wire`'s.
`tests/ingress/http2/test_client.py` holds it to `h2`'s client as the server side is held to
`h2`'s server: the same events and bytes over real conversations, the same verdict over
hostile frames, but for these departures, each RFC 9113's rule where `h2` ended the
connection:

- DATA before the final head, a 1xx head that ends its stream, comes after the final one or
  is malformed (`rules.malformed_answer`), a head on a stream the sandbox ended, and (as the
  server side) trailers without END_STREAM, are stream errors (RST_STREAM);
- a header block on a closed stream (by the ingress's reset, by both ends, or long ago) is
  answered with RST_STREAM and counted (`take_stray`), where `h2` ended the connection for a
  stream both ends closed, and forgot streams after 65,536;
- a HEADERS frame on a stream the sandbox opened (even: it cannot push) is PROTOCOL_ERROR,
  where `h2` took it as a request made to the client.

The answer's fields are checked by the connection (`rules.malformed_answer`), as a request's
are on the server side: a malformed one is the stream's error, not the connection's.
"""

from __future__ import annotations

from typing import Final

from wakeful.ingress.http2.frames import (
    END_STREAM,
    MAX_CONCURRENT_STREAMS,
    PREFACE,
    PROTOCOL_ERROR,
    RST_STREAM,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Fault,
    frame,
    u32,
)
from wakeful.ingress.http2.rules import malformed_answer
from wakeful.ingress.http2.streams import CannotSend, Stream
from wakeful.ingress.http2.wire import TRAILERS, Event, Wire

ANSWER: Final = 6
"""An answer's final head: `headers`, and `ended` if it has no body."""
LAST_STREAM_ID: Final = 2**31 - 1


class ClientWire(Wire):
    """One h2c connection to a sandbox: `open` a stream with a request's head, feed what the
    sandbox sent to `receive`, send the rest as `Wire` does."""

    def __init__(self, max_header_list_size: int, stream_window: int) -> None:
        super().__init__(0, max_header_list_size, stream_window)
        self._preface = 0  # the client sends it, and reads none
        self.peer_is_server = True
        self.local = [pair for pair in self.local if pair[0] != MAX_CONCURRENT_STREAMS]
        """What `h2`'s client sent, in its order: the server's, but no stream bound."""
        self.next_stream_id = 1
        self._answered: set[int] = set()
        """Streams whose final head came."""

    def initiate_connection(self) -> None:
        self._out += PREFACE
        super().initiate_connection()

    def room(self) -> int:
        """Streams that may still be opened: the sandbox's bound less those open (0 once the
        ids run out: the connection is for no more)."""
        if self.next_stream_id > LAST_STREAM_ID or self.ended:
            return 0
        return self.peer_max_streams - len(self.streams)

    def open(self, headers: list[tuple[bytes, bytes]], end_stream: bool) -> int:
        """A new stream with `headers` sent on it; its id. CannotSend past the sandbox's
        MAX_CONCURRENT_STREAMS, or once the ids ran out."""
        if self.room() <= 0:
            raise CannotSend(f"no stream may be opened ({len(self.streams)} open)")
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        self.streams[stream_id] = Stream(self.inbound_initial, self.outbound_initial)
        self.send_headers(stream_id, headers, end_stream)
        return stream_id

    def _close(self, stream_id: int, reset: bool) -> None:
        super()._close(stream_id, reset)
        self._answered.discard(stream_id)

    # -- what the sandbox sent -----------------------------------------------------------

    def _idle(self, stream_id: int) -> bool:
        """A stream never opened: any of the sandbox's (even: it cannot push), or one of ours
        not yet opened."""
        return stream_id % 2 == 0 or stream_id >= self.next_stream_id

    def _data(self, events: list[Event], flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open or stream_id in self._answered:
            super()._data(events, flags, stream_id, payload)
            return
        # Before the final head: malformed (RFC 9113 §8.1), the stream's error (h2: the
        # connection's). Its bytes still count on the connection's window, given back.
        size = len(payload)
        self.inbound.consumed(size)
        increment = self.inbound.processed_bytes(size)
        if increment:
            self._out += frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))
        self._provoked(events, stream_id, PROTOCOL_ERROR)

    def _fields(
        self,
        events: list[Event],
        stream_id: int,
        flags: int,
        weight: bytes,
        fields: list[tuple[bytes, bytes]],
    ) -> None:
        ended = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise Fault(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, never opened")
            # closed: by a reset of ours, or by its end (a late frame either way): refused
            self._stray += 1
            self._out += frame(RST_STREAM, 0, stream_id, STREAM_CLOSED.to_bytes(4, "big"))
            return
        if not stream.remote_open:  # half-closed (remote): a stream error (§5.1)
            self._provoked(events, stream_id, STREAM_CLOSED)
        elif weight and u32(weight, 0) & 0x7FFFFFFF == stream_id:
            self._provoked(events, stream_id, PROTOCOL_ERROR)  # RFC 9113 §5.3.1
        elif _informational(fields):
            # §8.1: a 1xx head ends nothing, comes before the final one, and is well formed
            if ended or stream_id in self._answered or malformed_answer(fields) is not None:
                self._provoked(events, stream_id, PROTOCOL_ERROR)
            else:  # skipped, and counted: a sandbox could send them without end
                self._stray += 1
        elif stream_id not in self._answered:
            self._answered.add(stream_id)
            events.append(Event(ANSWER, stream_id, headers=fields, ended=ended))
            if ended:
                self._remote_end(stream_id, stream)
        elif not ended:  # trailers must end it (§8.1): malformed, a stream error
            self._provoked(events, stream_id, PROTOCOL_ERROR)
        else:
            events.append(Event(TRAILERS, stream_id, headers=fields, ended=True))
            self._remote_end(stream_id, stream)


def _informational(fields: list[tuple[bytes, bytes]]) -> bool:
    """A 1xx head: its `:status` (among the pseudo-fields first) begins with 1, as `h2` read
    it."""
    for name, value in fields:
        if name[:1] != b":":
            return False
        if name == b":status":
            return value[:1] == b"1"
    return False
