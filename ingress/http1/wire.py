"""A client connection's flow control, both ways: what the server writes waits for the client
to read it, and reading from the client pauses while what it sent waits for the proxy.

`ClientConnection` is a `Wire`; `Body`, `Responder` and `ClientSide` write and pause through
it. An answer's head is held back and sent with its first body bytes (`hold`): one write, one
segment, since most answers are one read from the sandbox. Writes past the transport's
high-water mark wait at a `WriteGate`, at most `client_timeout` seconds (`drain`). Reading
pauses for named reasons (a full body buffer, a deep pipeline, a splice's full pipe, ...) and
resumes once none is left.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from wakeful.aio.flow import WriteGate

if TYPE_CHECKING:
    from wakeful.ingress.http1.server import Limits


class Wire(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, limits: Limits) -> None:
        self._loop = loop
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.gone = False
        """The client hung up."""
        self._paused: set[str] = set()
        self._drain = WriteGate(loop)
        self._held: bytes | None = None
        """An answer's head not written yet (`hold`)."""

    def pause_writing(self) -> None:
        self._drain.close()

    def resume_writing(self) -> None:
        self._drain.open()

    def hold(self, head: bytes) -> None:
        """An answer's head, sent with the first body bytes written (one write, one segment:
        most answers are one read from the sandbox). The handler flushes it before it waits
        for a body (`Responder.flush`); whatever is held goes out when the answer ends."""
        if self._held is None:
            self._held = head
        else:
            self._held += head

    def unhold(self, head: bytes) -> bool:
        """Take back `head`, held and not sent (`hold`): False when it went already."""
        held = self._held
        if held is None or not held.endswith(head):
            return False
        self._held = held[: len(held) - len(head)] or None
        return True

    def flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self.write(held)

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        if self.transport is not None and not self.gone:
            self.transport.write(data)

    async def drain(self) -> None:
        self.flush()
        drain = self._drain.waiting()
        if drain is None:
            return
        async with asyncio.timeout(self.limits.client_timeout):
            await asyncio.shield(drain)

    def pause_reading(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.gone:
            self.transport.pause_reading()
        self._paused.add(why)

    def resume_reading(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if not self._paused and self.transport is not None and not self.gone:
            self.transport.resume_reading()
