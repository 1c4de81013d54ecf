"""One HTTP/2 stream as a handler sees it: its request body (`StreamBody`) and the answer it
writes (`StreamResponder`), the same interfaces an HTTP/1.1 exchange has.

Flow control is the stream's bound both ways. What the client sends waits here until the
proxy reads it, and only then is it acknowledged (WINDOW_UPDATE): a client can never have more
than its stream window (`STREAM_WINDOW`) unread here. What the handler writes goes out as the
client's windows allow; the rest waits in `pending` and `drain` waits for it, at most the
client's timeout: a client that never opens its window holds its stream, its lease and what
was read for it (the sandbox's answer up to `HIGH_WATER`, and one chunk) that long, then the
stream is reset and all of it goes back.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from wakeful.ingress.errors import BadRequest, ClientGone, UpstreamFailed
from wakeful.ingress.http1.request import Arrivals
from wakeful.ingress.http1.responder import SHORT_ANSWER, ClientSide, Responder
from wakeful.ingress.streams import chunks

if TYPE_CHECKING:
    from wakeful.ingress.http2.connection import H2Connection
    from wakeful.ingress.http2.sender import Sender

STREAM_WINDOW = 64 * 1024
"""The window each stream advertises: request body bytes that may wait for the proxy."""
SMALL = 1024
"""DATA frames below this are gathered into one buffer, up to 16 of this."""


class StreamBody(Arrivals):
    """A request's body on one stream; implements `http1.RequestBody`."""

    __slots__ = ("_conn", "_id", "_left", "_small", "quiet")

    def __init__(
        self, conn: H2Connection, stream_id: int, quiet: float, length: int | None
    ) -> None:
        super().__init__()
        self._conn = conn
        self._id = stream_id
        self._left = length
        """What its Content-Length still promises (None: no length declared)."""
        self._small = bytearray()
        """Small DATA frames gathered (a client sending a byte a frame would otherwise hold
        ~40 bytes of memory a byte of its window)."""
        self.quiet = quiet
        """Seconds the client may send nothing mid-body (a gRPC stream's are the app's
        stream idle timeout: the edge sets them)."""

    @property
    def complete(self) -> bool:
        return self._done and not self._chunks and not self._small

    @property
    def short(self) -> bool:
        """Less came than its Content-Length declared."""
        return bool(self._left)

    @property
    def long(self) -> bool:
        """More came than its Content-Length declared (the connection resets the stream)."""
        return self._left is not None and self._left < 0

    def end(self) -> None:
        """The stream ended: a body short of its Content-Length fails (an HTTP/1.1 sandbox
        would take the next request on its connection for the rest), else it is whole."""
        if self._left:
            self.fail(BadRequest("the request's body is shorter than its content-length"))
        else:
            super().end()

    def feed(self, chunk: bytes) -> None:
        if self._left is not None:
            self._left -= len(chunk)
        small = self._small
        if len(chunk) < SMALL:
            small += chunk
            if len(small) >= SMALL * 16:
                self._chunks.append(bytes(small))
                small.clear()
        else:
            if small:
                self._chunks.append(bytes(small))
                small.clear()
            self._chunks.append(chunk)
        self._wake()

    def drop_unread(self) -> int:
        """Forget what came and nobody will read (the stream ended first); how many bytes:
        the connection acknowledges them, or its window would shrink for good."""
        unread = sum(map(len, self._chunks)) + len(self._small)
        self._chunks.clear()
        self._small.clear()
        return unread

    def stream(self) -> AsyncIterator[bytes]:
        return chunks(self.next_chunk)

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body as it arrives; None at its end."""
        self.started = True
        while True:
            if not self._chunks and self._small:
                self._chunks.append(bytes(self._small))
                self._small.clear()
            if self._chunks:
                chunk = self._chunks.popleft()
                self._conn.consumed(self._id, len(chunk))
                return chunk
            if self._done:
                return None
            if self._error is not None:
                if isinstance(self._error, ClientGone):
                    self.client_gone = True
                raise self._error
            await self._next_arrival(self.quiet)


class StreamResponder(Responder):
    """Writes one answer on a stream (`http1.Responder`): the head held until the first body
    bytes or the end (a body-less answer is one HEADERS frame with END_STREAM, as gRPC's
    trailers-only answers need), the body as the windows allow, trailers at the end."""

    __slots__ = (
        "_head",
        "_head_only",
        "_id",
        "_left",
        "_no_body",
        "_out",
        "closed",
        "complete",
        "ending",
        "pending",
        "pending_bytes",
        "stream_id",
    )

    def __init__(self, out: Sender, stream_id: int, head_only: bool) -> None:
        """`out`: the connection's way out (`http2.sender`)."""
        self._out = out
        self._id = self.stream_id = stream_id
        self._no_body = self._head_only = head_only
        self._head: list[tuple[bytes, bytes]] | None = None
        self._left: int | None = None
        self.pending: collections.deque[bytes] = collections.deque()
        """Body bytes written and not yet sent (until the next write out, or while the
        windows are shut)."""
        self.pending_bytes = 0
        self.ending: Sequence[tuple[bytes, bytes]] | None = None
        """The trailers (or none) to end the stream with once `pending` is sent."""
        self.started = False
        self.complete = False
        self.closed = False
        """The stream ended (its end sent, or reset): nothing more is written."""

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        if status in (204, 304):
            self._no_body = True
        head = [(b":status", b"%d" % status)]
        length = False
        for pair in headers:
            name = pair[0]
            if name == b"content-length":  # one (an h2c sandbox may repeat it), none on a
                if length or status == 204:  # 204 (RFC 9110 §8.6; nghttp2 refuses it)
                    continue
                length = True
                if not self._no_body:
                    self._left = int(pair[1])
            head.append(pair)
        self._head = head

    def unstart(self) -> bool:
        if not self.started or self._head is None:
            return False
        self._head = self._left = None
        self._no_body = self._head_only
        self.started = False
        return True

    def _send_head(self, end: bool) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._out.send_head(self._id, head, end)

    def write(self, chunk: bytes) -> bool:
        if self._no_body or not chunk:
            return False
        if self.closed:  # reset: relaying more of the answer would only hold its lease
            raise ClientGone("the stream was reset")
        if self._left is not None:
            if len(chunk) > self._left:
                raise UpstreamFailed("the sandbox sent more body than its Content-Length")
            self._left -= len(chunk)
        self._send_head(False)
        self.pending.append(chunk)
        self.pending_bytes += len(chunk)
        self._out.later(self._id, self)
        return self.pending_bytes >= STREAM_WINDOW or self._out.writes_paused

    def flush(self) -> None:
        self._send_head(False)
        self._out.flush()

    async def drain(self) -> None:
        await self._out.drain(self)

    def end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        if self.closed:
            return
        if self._left:  # short of its Content-Length (h2 holds an h2c sandbox's DATA to it,
            raise UpstreamFailed(SHORT_ANSWER)  # not an answer that its HEADERS or trailers end)
        self.complete = True
        if self._head is not None and not self.pending and not trailers:
            self._send_head(True)
            self.closed = True
            self._out.flush()
            return
        self._send_head(False)
        self.ending = trailers
        self._out.later(self._id, self)

    def switch(self, headers: list[tuple[bytes, bytes]]) -> ClientSide:
        raise RuntimeError("no protocol switch on an HTTP/2 stream")

    def send_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if not any(name == b"content-length" for name, _ in headers):
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        self.start(status, headers)
        self.write(body)
        self.end()
        self._left = None
        self.complete = True
