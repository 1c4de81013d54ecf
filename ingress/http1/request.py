"""A request as the HTTP/1.1 server hands it to its handler, and its body as the proxy pulls it.

The body streams: `Body.feed` takes what the parser reads, `Body.stream` gives it to the proxy.
At most `BODY_BUFFER` bytes wait between the two before reading from the client pauses; the
client's silence mid-body is bounded by `client_timeout` (408). `100 Continue` goes out when
the body is first read, not before: a request refused before that never asks for its body.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from wakeful.aio.flow import HIGH_WATER, LOW_WATER
from wakeful.ingress.errors import ClientGone, ClientTooSlow
from wakeful.ingress.streams import chunks

if TYPE_CHECKING:
    from wakeful.ingress.http1.connection import ClientConnection

BODY_BUFFER = HIGH_WATER


class Arrivals:
    """What a request body is on either protocol while it comes: the parts that came and wait
    for their reader, its end or why it cannot end, and the reader waiting for the next
    (`Body` here, `http2.StreamBody` on an HTTP/2 stream)."""

    __slots__ = ("_chunks", "_done", "_error", "_waiter", "client_gone", "started")

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._done = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.started = False
        self.client_gone = False

    def end(self) -> None:
        self._done = True
        self._wake()

    def fail(self, exc: Exception) -> None:
        """The rest of the body cannot be read (malformed, or its client gone): `stream`
        raises `exc`."""
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _next_arrival(self, quiet: float) -> None:
        """Wait for more, the end or a failure; ClientTooSlow after `quiet` seconds."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(quiet):
                await self._waiter
        except TimeoutError:
            raise ClientTooSlow(f"the client sent none of its body for {quiet:g} s") from None
        finally:
            self._waiter = None


class Body(Arrivals):
    """A request's body as the proxy pulls it; implements `proxy.RequestBody`."""

    __slots__ = ("_conn", "_continue", "_size")

    def __init__(self, conn: ClientConnection, expect_continue: bool) -> None:
        super().__init__()
        self._conn = conn
        self._continue = expect_continue
        self._size = 0

    @property
    def complete(self) -> bool:
        return self._done and not self._chunks

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > BODY_BUFFER:
            self._conn.pause_reading("body")
        self._wake()

    def stream(self) -> AsyncIterator[bytes]:
        return chunks(self.next_chunk)

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body as it arrives; None at its end."""
        self.started = True
        if self._continue and not self._done and not self._chunks:
            self._continue = False
            self._conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        timeout = self._conn.limits.client_timeout
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._size -= len(chunk)
                if self._size <= LOW_WATER:
                    self._conn.resume_reading("body")
                return chunk
            if self._done:
                return None
            if self._error is not None:
                raise self._error
            if self._conn.gone:
                self.client_gone = True
                raise ClientGone("the client hung up while sending its body")
            await self._next_arrival(timeout)


class RequestBody(Protocol):
    """A request's body as a handler reads it: `Body` on HTTP/1.1, `http2.StreamBody` on an
    HTTP/2 stream (what `proxy.RequestBody` needs, and whether it was read to its end)."""

    @property
    def started(self) -> bool: ...

    @property
    def client_gone(self) -> bool: ...

    @property
    def complete(self) -> bool: ...

    def stream(self) -> AsyncIterator[bytes]: ...


@dataclass(slots=True, init=False)
class Request:
    method: str
    target: bytes
    """Path and query exactly as received."""
    headers: list[tuple[bytes, bytes]]
    """Names lower-cased, values as received, in order."""
    version: str
    """"1.1", "1.0", or "2" (an HTTP/2 stream)."""
    keep_alive: bool
    client: str
    body: RequestBody | None
    upgrade: bool = False
    """A WebSocket handshake (`ingress.websocket`): nothing after it on the connection is HTTP."""
    scheme: str = "http"
    """"https" on the TLS listener."""
    resent: bool = False
    """It went out once on a pooled connection that closed unanswered (`ingress.direct`):
    what is left is its one resend, on a fresh connection."""
    request_id: str = ""
    """The id it went out with then, which the resend carries too ("" otherwise)."""
    route: tuple[str, str | None, bool] | None = None
    """The route the direct path chose for it (`ingress.direct`), which the general path keeps
    when it answers the request after all: a split's next pick was that one (None: none
    chosen yet)."""

    def __init__(  # written out: compiled, where a dataclass's own would be interpreted
        self,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        version: str,
        keep_alive: bool,
        client: str,
        body: RequestBody | None,
        upgrade: bool = False,
        scheme: str = "http",
    ) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.version = version
        self.keep_alive = keep_alive
        self.client = client
        self.body = body
        self.upgrade = upgrade
        self.scheme = scheme
        self.resent = False
        self.request_id = ""
        self.route = None
