"""A request body read ahead before the request takes any capacity (`Proxy.open`): up to
`PREREAD_BYTES`, as nginx's request buffering does, then replayed from the start for each
attempt while nothing past what was kept has been read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

from wakeful.ingress.streams import chunks

if TYPE_CHECKING:
    from wakeful.ingress.proxy import RequestBody

PREREAD_BYTES: Final = 64 * 1024
"""A request body is read up to this much before the request takes a lease or an upstream
connection."""


async def preread(body: RequestBody, limit: int = PREREAD_BYTES) -> RequestBody:
    """Read `body` up to `limit` bytes now. A client that trickles a small body in then holds
    neither a lease (the sandbox's capacity) nor an upstream connection (its app's share) while
    it does, as nginx's request buffering; a body read whole can also be sent again when a
    sandbox refused the connection. A larger body streams on from where this stopped."""
    chunks: list[bytes] = []
    size = 0
    rest = body.stream().__aiter__()
    while size < limit:
        try:
            chunk = await anext(rest)
        except StopAsyncIteration:
            return _Preread(chunks, None, body)
        chunks.append(chunk)
        size += len(chunk)
    return _Preread(chunks, rest, body)


class _Preread:
    """A body read before the request was sent: what was read, then the rest as it comes."""

    __slots__ = ("_chunks", "_pulled", "_rest", "_source")

    def __init__(
        self, chunks: list[bytes], rest: AsyncIterator[bytes] | None, source: RequestBody
    ) -> None:
        self._chunks = chunks
        self._rest = rest
        self._source = source
        self._pulled = False

    @property
    def started(self) -> bool:
        """What was read before can be sent again; once the rest is being read, it cannot."""
        return self._pulled

    @property
    def client_gone(self) -> bool:
        return self._source.client_gone

    def stream(self) -> AsyncIterator[bytes]:
        """What was read, then the rest: from the start at each call (a retry sends it
        again)."""
        return chunks(_Replay(self).next_chunk)


class _Replay:
    """One pass over a `_Preread`."""

    __slots__ = ("_next", "_preread")

    def __init__(self, preread: _Preread) -> None:
        self._preread = preread
        self._next = 0

    async def next_chunk(self) -> bytes | None:
        preread = self._preread
        if self._next < len(preread._chunks):
            self._next += 1
            return preread._chunks[self._next - 1]
        if preread._rest is None:
            return None
        preread._pulled = True
        try:
            return await anext(preread._rest)
        except StopAsyncIteration:
            return None
