"""Writing an answer on a client connection: the `Responder` a handler answers through (and
`Http1Responder`, its HTTP/1.1 side), the client's end of a WebSocket splice (`ClientSide`),
and the server's own canned answers.

An `Http1Responder` frames the body it is given: with the Content-Length the head carries,
chunked for HTTP/1.1 otherwise, by the end of the connection for HTTP/1.0; no body after HEAD,
1xx, 204 or 304. The head is held back and sent with the first body bytes (one write, one segment).
"""

from __future__ import annotations

import http
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from wakeful.aio.pipe import Pipe
from wakeful.ingress.errors import ClientGone, UpstreamFailed
from wakeful.ingress.http1.request import Request

if TYPE_CHECKING:
    from wakeful.ingress.http1.connection import ClientConnection

_REASONS: Final = {status.value: status.phrase.encode() for status in http.HTTPStatus}
_STATUS_LINES: Final = {
    code: b"HTTP/1.1 %d %s" % (code, reason) for code, reason in _REASONS.items()
}
"""Each known status's line (`Http1Responder.start`)."""


def _canned(status: int, text: str, *extra: bytes) -> bytes:
    body = text.encode() + b"\n"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n%s\r\n%s"
        % (status, _REASONS[status], len(body), b"".join(extra), body)
    )


BAD_REQUEST: Final = _canned(400, "the request is malformed")
TOO_LARGE: Final = _canned(431, "request line and headers are too large")
TOO_SLOW: Final = _canned(408, "the request head did not come in time")
TOO_MANY: Final = _canned(503, "too many connections to this ingress", b"retry-after: 1\r\n")

SHORT_ANSWER: Final = "the sandbox's answer is shorter than its content-length"


class Responder:
    """What a handler answers through, whatever the client speaks: `Http1Responder` on an
    HTTP/1.1 connection, `http2.StreamResponder` on an HTTP/2 stream. A base class rather than a
    protocol: compiled, a call through a protocol is a call through the interpreter, through a
    base class a direct one (every request makes several)."""

    __slots__ = ("started",)

    started: bool
    """The answer's head was given (`start`, `send_whole`, `switch`)."""

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def write(self, chunk: bytes) -> bool:
        """Send a piece of the body; True when the caller must `await drain()` first."""
        raise NotImplementedError

    def flush(self) -> None:
        """Send the head now if no body went with it yet: call before waiting for the body."""
        raise NotImplementedError

    async def drain(self) -> None:
        """Wait for room (TimeoutError when the client reads none of it in its time)."""
        raise NotImplementedError

    def end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """The body is complete; `trailers` go to clients that can take them (HTTP/2)."""
        raise NotImplementedError

    def switch(self, headers: list[tuple[bytes, bytes]]) -> ClientSide:
        """Answer 101 and hand over the connection (an HTTP/1.1 WebSocket handshake only)."""
        raise NotImplementedError

    def send_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A complete small answer at once."""
        raise NotImplementedError

    def unstart(self) -> bool:
        """Take the answer back if none of it was sent yet (its head is only held): then an
        error answer can go in its place. False once any of it went."""
        raise NotImplementedError


class Http1Responder(Responder):
    """Writes one answer, framing its body: Content-Length when the head has one, chunked for
    HTTP/1.1 otherwise, the end of the connection for HTTP/1.0; no body after HEAD, 1xx, 204
    or 304. Trailers are not sent (an HTTP/1.1 client rarely asks for them; gRPC needs
    HTTP/2)."""

    __slots__ = ("_chunked", "_conn", "_head", "_left", "_no_body", "_request", "complete")

    def __init__(self, conn: ClientConnection, request: Request) -> None:
        self._conn = conn
        self._request = request
        self._chunked = False
        self._no_body = False
        self._left: int | None = None
        """Body bytes the Content-Length sent still promises (None: no length sent)."""
        self._head = b""
        """The head given to `hold` (`unstart`)."""
        self.started = False
        self.complete = False

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        request = self._request
        self.started = True
        self._no_body = request.method == "HEAD" or status in (204, 304) or status < 200
        # Each line made by concatenation, the lines joined once on CRLF: compiled, that
        # costs less than appending a header's four pieces to one list, or formatting.
        lines = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown" % status]
        length: bytes | None = None
        for name, value in headers:
            if name == b"content-length":  # one (an h2c sandbox may repeat it), none on a
                if length is not None or status == 204:  # 204 (RFC 9110 §8.6)
                    continue
                length = value
            lines.append(name + b": " + value)
        if length is not None and not self._no_body:
            self._left = int(length)  # the sandbox's, checked by the upstream parser
        body_unread = request.body is not None and not request.body.complete
        keep = request.keep_alive and not self._conn.last_answer and not body_unread
        if not self._no_body and length is None:
            if request.version == "1.1":
                self._chunked = True
                lines.append(b"transfer-encoding: chunked")
            else:
                keep = False  # the end of the connection ends the body
        if not keep:
            request.keep_alive = False
            lines.append(b"connection: close")
        elif request.version == "1.0":
            lines.append(b"connection: keep-alive")
        lines.append(b"\r\n")  # the join puts the last line's CRLF before it: the blank line
        self._head = b"\r\n".join(lines)
        self._conn.hold(self._head)

    def unstart(self) -> bool:
        if not self.started or not self._head or not self._conn.unhold(self._head):
            return False
        self.started = self._chunked = False
        self._left = None  # a connection `start` chose to close stays so
        return True

    def write(self, chunk: bytes) -> bool:
        """Send a piece of the body (with the head, the first time). Never more than the
        Content-Length sent promised: past it the answer is cut. True when the client's
        buffer is full: then `await drain()` before writing more."""
        if self._no_body or not chunk:
            return False
        if self._left is not None:
            if len(chunk) > self._left:
                raise UpstreamFailed("the sandbox sent more body than its Content-Length")
            self._left -= len(chunk)
        conn = self._conn
        if self._chunked:
            conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            conn.write(chunk)
        return conn._drain.waiting() is not None

    def flush(self) -> None:
        """Send the head now if no body went with it yet: call before waiting for the body."""
        self._conn.flush()

    async def drain(self) -> None:
        """Wait for room in the client's buffer; TimeoutError when the client reads none of
        it within its timeout."""
        await self._conn.drain()

    def end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        if self._left:  # short of its Content-Length (an h2c sandbox's): cut, or a 502 while
            raise UpstreamFailed(SHORT_ANSWER)  # its head is held (`unstart`)
        if self._chunked:
            self._conn.write(b"0\r\n\r\n")
        else:
            self._conn.flush()  # an answer with no body: its head goes now, not at the end
        self.complete = True

    def switch(self, headers: list[tuple[bytes, bytes]]) -> ClientSide:
        """Answer 101 with `headers` and hand over the connection: the client's end of the
        splice. The connection closes when the exchange ends."""
        pipe = self._conn.spliced
        assert self._request.upgrade and pipe is not None
        self.started = self.complete = True
        self._request.keep_alive = False
        lines = [b"HTTP/1.1 101 Switching Protocols\r\n"]
        lines.extend(b"%s: %s\r\n" % pair for pair in headers)
        lines.append(b"\r\n")
        self._conn.write(b"".join(lines))
        return ClientSide(self._conn, pipe)

    def send_whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A complete small answer at once (error answers, which carry their length)."""
        if not any(name == b"content-length" for name, _ in headers):
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        self.start(status, headers)
        if not self._no_body:
            self._conn.write(body)
        self._left = None
        self.complete = True


class ClientSide:
    """The client's end of a splice (`ingress.websocket.Side`)."""

    __slots__ = ("_conn", "pipe")

    def __init__(self, conn: ClientConnection, pipe: Pipe) -> None:
        self._conn = conn
        self.pipe = pipe

    def write(self, data: bytes) -> None:
        self._conn.write(data)

    async def drain(self) -> None:
        await self._conn.drain()
        if self._conn.gone:
            raise ClientGone("the client hung up")
