"""One exchange on a stream of a shared h2c connection (`upstream.h2c`): the request's
answer as the proxy reads it (`transport.UpstreamResponse`): its head, its body as it comes,
its trailers, and `close`, which gives the stream back to its connection (reset there when
the sandbox has not ended it).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from wakeful.aio.deadline import Deadline
from wakeful.ingress.errors import UpstreamTimeout
from wakeful.ingress.http2.rules import content_length, fit_for_http1
from wakeful.ingress.transport import UpstreamResponse

if TYPE_CHECKING:
    from wakeful.ingress.upstream.h2c import H2Upstream


class H2Exchange(UpstreamResponse):
    """One request and its answer on a stream: a `transport.UpstreamResponse`."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_ended",
        "_error",
        "_expected",
        "_expiry",
        "_head",
        "_head_request",
        "_idle",
        "_received",
        "_silence",
        "_waiter",
        "_within",
        "_writer",
        "answered",
        "closed",
        "on_close",
        "sandbox_done",
        "stream_id",
    )

    def __init__(self, conn: H2Upstream, stream_id: int, idle: float, head_request: bool) -> None:
        self.splice = None  # set here: a compiled class has no class defaults
        self._conn = conn
        self.stream_id = stream_id
        self._idle = idle
        self._head_request = head_request
        """A HEAD request: its answer has no body, whatever length it declares."""
        self._expected: int | None = None
        """The body's length as the answer declared it (None: not declared)."""
        self._received = 0
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._silence = Deadline(conn.loop, self._silent)
        """Set while the proxy waits for the head (`_within` seconds) or for body bytes
        (`_idle`): one timer an exchange, where `asyncio.timeout` made one a wait, with a
        shield, interpreted (a few per cent of a gRPC call's CPU)."""
        self._within = 0.0
        self.on_close: Callable[[], None] | None = None
        """Run once when the exchange is closed (the transport gives its slot back)."""
        self.answered = False
        self.closed = False
        self.sandbox_done = False
        """The sandbox ended or reset the stream (or the connection went): nothing to reset."""
        self.status = 0
        self.headers = ()
        self.trailers = ()

    # -- from the connection ------------------------------------------------------------

    def got_head(self, headers: list[tuple[bytes, bytes]], ended: bool) -> str | None:
        """The answer's final head (its fields valid HTTP/2: `rules.malformed_answer`); why
        it cannot be taken, if it cannot (the connection resets the stream)."""
        status = b""
        fields = []
        length: int | None = None
        for name, value in headers:
            if name == b":status":
                status = value
            elif name == b"content-length":  # what the body is held to (RFC 9113 §8.1.1)
                declared = content_length(value)
                if declared < 0 or (length is not None and declared != length):
                    return f"a content-length of {value[:40]!r}, or two that differ"
                length = declared
                fields.append((name, value))
            elif name[:1] != b":" and fit_for_http1(name, value):
                fields.append((name, value))
        # Three digits, a final answer (1xx heads are skipped): `int` alone took "+200",
        # "2_00", "-1" and twenty digits (a hostile tester's find).
        if len(status) != 3 or not status.isdigit() or not 200 <= int(status) <= 599:
            return f"no valid :status ({status[:40]!r})"
        self.status = int(status)
        if self._head_request or self.status in (204, 304):  # no body, whatever length it
            length = 0  # names (RFC 9113 §8.1.1)
        if ended and length:  # short: refused before its head is taken
            return f"no body, short of its content-length of {length}"
        self._expected = length
        self.headers = fields
        self.answered = True
        if not self._head.done():
            self._head.set_result(None)
        return self.got_end() if ended else None

    def got_data(self, data: bytes, ended: bool) -> str | None:
        """Body bytes; why they break the declared length, if they do."""
        self._received += len(data)
        expected = self._expected
        if expected is not None and (
            self._received > expected or (ended and self._received != expected)
        ):  # refused before it is taken: the connection counts its bytes as read
            return f"a body of {self._received} bytes for a content-length of {expected}"
        if data:
            self._chunks.append(data)
            self._wake()
        return self.got_end() if ended else None

    def got_end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> str | None:
        """The answer's end, with its trailers; why it is short, if it is."""
        if self._expected is not None and self._received != self._expected:
            return f"a body of {self._received} bytes, short of its content-length"
        self.sandbox_done = True
        if trailers:
            self.trailers = [pair for pair in trailers if pair[0][:1] != b":"]
        self._ended = True
        self._wake()
        return None

    def fail(self, exc: BaseException) -> None:
        if self._ended or self._error is not None:
            return
        self._error = exc
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a caller that left must not log it
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def drop_unread(self) -> int:
        """Forget the answer's bytes nobody will read; how many there were (the connection
        acknowledges them: otherwise its shared window would shrink for good)."""
        unread = sum(map(len, self._chunks))
        self._chunks.clear()
        return unread

    # -- UpstreamResponse ----------------------------------------------------------------

    def limit(self, longest: float) -> None:
        """End the exchange `longest` seconds from now, busy or not (a stream's maximum
        duration, as a WebSocket's)."""
        self._expiry = self._conn.loop.call_later(longest, self._expire, longest)

    def _expire(self, longest: float) -> None:
        """The error made only when it happens (`limit` is set on every call)."""
        self.fail(UpstreamTimeout(f"the stream reached its maximum duration ({longest:g} s)"))

    async def wait_head(self, within: float) -> None:
        head = self._head
        if not head.done():
            self._within = within
            self._silence.after(within)
            try:
                await head  # a caller cancelled cancels it: the exchange is closed then
            finally:
                self._silence.clear()
        head.result()

    def _silent(self) -> None:
        """The deadline passed: a wait still pending fails (its event may have come in the
        same turn, its task not yet woken: then nothing)."""
        if not self._head.done():
            self.fail(UpstreamTimeout(f"the sandbox did not answer within {self._within:g} s"))
        elif self._waiter is not None and not self._waiter.done():
            self.fail(UpstreamTimeout(f"the sandbox stayed silent for {self._idle:g} s"))

    def next_nowait(self) -> bytes | None:
        if self._chunks:
            chunk = self._chunks.popleft()
            self._conn.consumed(self.stream_id, len(chunk))
            return chunk
        if self._ended:
            return b""
        if self._error is not None:
            raise self._error
        return None

    async def next(self) -> bytes:
        while True:
            chunk = self.next_nowait()
            if chunk is not None:
                return chunk
            self._waiter = self._conn.loop.create_future()
            self._silence.after(self._idle)
            try:
                await self._waiter
            finally:
                self._waiter = None
                self._silence.clear()  # not the sandbox's silence while the client reads

    def close(self) -> None:
        """The exchange is over: a stream not ended is reset (the sandbox stops its work)."""
        if self.closed:
            return
        self.closed = True
        self._silence.cancel()
        if self._expiry is not None:
            self._expiry.cancel()
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
        self._conn.finished(self)
        if self.on_close is not None:
            self.on_close()
