"""Flow control on asyncio protocols: how much may wait in memory, and a gate for writers.

Reading: bytes a protocol received wait in memory for the task that consumes them (a client's
answer, the other side of a WebSocket, a tunnel stream); past `HIGH_WATER` of them the protocol
stops reading (`pause_reading`), and it reads again once the consumer has taken them down to
`LOW_WATER` (`wakeful.aio.pipe.Pipe`). Writing: a transport's own buffer is bounded by the same
mark (`set_write_buffer_limits(high=HIGH_WATER)`).

`WriteGate`: asyncio calls `pause_writing` when the transport's buffer passes its high-water
mark and `resume_writing` when it drains; a writer that must not grow the buffer further waits
for the gate to open. The end of the connection opens it too: `open()` lets waiters go on
(they then see the connection gone), `fail(exc)` makes them raise `exc`.
"""

from __future__ import annotations

import asyncio
from typing import Final

HIGH_WATER: Final = 256 * 1024
"""Bytes one connection's side may hold in memory, waiting for the other, before it stops
reading from its peer."""
LOW_WATER: Final = HIGH_WATER // 4
"""...and reads again once no more than this waits."""


class WriteGate:
    __slots__ = ("_closed", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._closed: asyncio.Future[None] | None = None

    def close(self) -> None:
        """`pause_writing`."""
        if self._closed is None or self._closed.done():
            self._closed = self._loop.create_future()

    def open(self) -> None:
        """`resume_writing`, or the end of the connection when waiters should go on."""
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """The end of the connection, when waiters should raise `exc`."""
        if self._closed is not None and not self._closed.done():
            self._closed.set_exception(exc)
            self._closed.exception()  # retrieved: no writer may be waiting on it

    def waiting(self) -> asyncio.Future[None] | None:
        """What a writer awaits before writing more; None while the gate is open."""
        closed = self._closed
        return None if closed is None or closed.done() else closed
