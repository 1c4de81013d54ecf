"""A bounded pipe of bytes from an asyncio protocol's callbacks to the task that consumes them.

The protocol `feed`s what it received and `end`s the pipe when its side closed; the consumer
`get`s chunks in order, then b"" once everything fed before the end was read. Bounded: once
more than `high` bytes wait, `pause()` is called (the protocol's transport stops reading) and,
once the consumer has taken them down to `low`, `resume()`. Each is called once per crossing,
never twice in a row. One consumer at a time.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from wakeful.aio.flow import HIGH_WATER, LOW_WATER


class Pipe:
    __slots__ = (
        "_chunks",
        "_ended",
        "_high",
        "_low",
        "_pause",
        "_paused",
        "_resume",
        "_size",
        "_waiter",
    )

    def __init__(
        self,
        pause: Callable[[], None],
        resume: Callable[[], None],
        *,
        high: int = HIGH_WATER,
        low: int = LOW_WATER,
    ) -> None:
        if not 0 <= low < high:
            raise ValueError(f"a pipe needs 0 <= low < high, got {low}, {high}")
        self._pause = pause
        self._resume = resume
        self._high = high
        self._low = low
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._paused = False
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def size(self) -> int:
        """Bytes fed and not read yet."""
        return self._size

    @property
    def ended(self) -> bool:
        """The side closed: nothing more will be fed (what was may still be unread)."""
        return self._ended

    def feed(self, data: bytes) -> None:
        if not data or self._ended:
            return
        self._chunks.append(data)
        self._size += len(data)
        if self._size > self._high and not self._paused:
            self._paused = True
            self._pause()
        self._wake()

    def end(self) -> None:
        """The side closed (or broke): what was fed is still read, then b""."""
        self._ended = True
        self._wake()

    def get_nowait(self) -> bytes | None:
        """The next chunk fed; b"" once the pipe ended and everything was read; None when
        nothing is there yet."""
        if self._chunks:
            chunk = self._chunks.popleft()
            self._taken(len(chunk))
            return chunk
        return b"" if self._ended else None

    async def get(self, limit: int | None = None) -> bytes:
        """The next bytes fed (waiting for some); b"" once the pipe ended and everything was
        read. With `limit`, as many of the chunks waiting as fit in `limit` bytes, joined (a
        chunk that does not fit whole is cut, its rest read next)."""
        while not self._chunks and not self._ended:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if limit is None or not self._chunks:
            chunk = self.get_nowait()
            assert chunk is not None  # a chunk is there, or the pipe ended
            return chunk
        parts = []
        size = 0
        while self._chunks and size < limit:
            part = self._chunks.popleft()
            if size + len(part) > limit:
                cut = limit - size
                self._chunks.appendleft(part[cut:])
                part = part[:cut]
            parts.append(part)
            size += len(part)
        self._taken(size)
        return b"".join(parts)

    def _taken(self, size: int) -> None:
        self._size -= size
        if self._paused and self._size <= self._low:
            self._paused = False
            self._resume()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
