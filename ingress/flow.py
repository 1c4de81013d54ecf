"""Write flow control for one connection's protocol, shared by the client side (`http1.py`) and
the sandbox side (`upstream.py`).

asyncio calls `pause_writing` when the transport's buffer passes its high-water mark and
`resume_writing` when it drains; a writer that must not grow the buffer further waits for the
gate to open. The end of the connection opens it too: `open()` lets waiters go on (they then
see the connection gone), `fail(exc)` makes them raise `exc`.
"""

from __future__ import annotations

import asyncio


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
