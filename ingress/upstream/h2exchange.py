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

from wakeful.ingress.errors import UpstreamFailed, UpstreamTimeout
from wakeful.ingress.http2.rules import fit_for_http1
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
        "_expiry",
        "_head",
        "_idle",
        "_waiter",
        "_writer",
        "answered",
        "closed",
        "on_close",
        "sandbox_done",
        "stream_id",
    )

    def __init__(self, conn: H2Upstream, stream_id: int, idle: float) -> None:
        self.splice = None  # set here: a compiled class has no class defaults
        self._conn = conn
        self.stream_id = stream_id
        self._idle = idle
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
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

    def got_head(self, headers: list[tuple[bytes, bytes]]) -> None:
        status = b""
        fields = []
        for name, value in headers:
            if name == b":status":
                status = value
            elif name[:1] != b":" and fit_for_http1(name, value):
                fields.append((name, value))
        # Three digits, a final answer (h2 gives 1xx heads apart): `int` alone took "+200",
        # "2_00", "-1" and twenty digits (a hostile tester's find).
        if len(status) != 3 or not status.isdigit() or not 200 <= int(status) <= 599:
            self.fail(UpstreamFailed(f"the sandbox's answer has no valid :status ({status!r})"))
            return
        self.status = int(status)
        self.headers = fields
        self.answered = True
        if not self._head.done():
            self._head.set_result(None)

    def got_data(self, data: bytes) -> None:
        self._chunks.append(data)
        self._wake()

    def got_end(self, trailers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.sandbox_done = True
        if trailers:
            self.trailers = [pair for pair in trailers if pair[0][:1] != b":"]
        self._ended = True
        self._wake()

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
        self._expiry = self._conn.loop.call_later(
            longest,
            self.fail,
            UpstreamTimeout(f"the stream reached its maximum duration ({longest:g} s)"),
        )

    async def wait_head(self, within: float) -> None:
        try:
            async with asyncio.timeout(within):
                await asyncio.shield(self._head)
        except TimeoutError:
            raise UpstreamTimeout(f"the sandbox did not answer within {within:g} s") from None

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
            try:
                async with asyncio.timeout(self._idle):
                    await self._waiter
            except TimeoutError:
                self.fail(UpstreamTimeout(f"the sandbox stayed silent for {self._idle:g} s"))
            finally:
                self._waiter = None

    def close(self) -> None:
        """The exchange is over: a stream not ended is reset (the sandbox stops its work)."""
        if self.closed:
            return
        self.closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
        self._conn.finished(self)
        if self.on_close is not None:
            self.on_close()
