"""A client connection's flow control, both ways: what the server writes waits for the client
to read it, and reading from the client pauses while what it sent waits for the proxy.

`ClientConnection` is a `Wire`; `Body`, `Responder` and `ClientSide` write and pause through
it. An answer's head is held back and sent with its first body bytes (`hold`): one write, one
segment, since most answers are one read from the sandbox. Writes past the transport's
high-water mark wait at a `WriteGate`, at most `client_timeout` seconds (`drain`). Reading
pauses for named reasons (a full body buffer, a deep pipeline, a splice's full pipe, ...) and
resumes once none is left. And how the connection ends: closed once what is written went out
(`_close`), or half-closed to read away a body nobody will read (`_linger`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from wakeful.aio.flow import WriteGate

if TYPE_CHECKING:
    from wakeful.ingress.http1.server import Limits

LINGER_SECONDS: Final = 5.0
LINGER_BYTES: Final = 16 << 20
"""How long, and how much, a connection answered before its request body was read reads it
away (`Wire._linger`); nginx's lingering_timeout is 5 s too."""


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
        self.closing = False
        """No request after the one being answered."""
        self._lingering, self._lingered = False, 0
        self._linger_timer: asyncio.TimerHandle | None = None

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

    # -- closing -----------------------------------------------------------------------

    def _close(self, abort: bool = False) -> None:
        """Close once what is written went out, aborted if the client has not read it within
        its timeout (it would keep its slot for ever); `abort`: now, dropping it."""
        self.closing = True
        transport = self.transport
        if transport is None or (not abort and transport.is_closing()):
            return  # closing already: the abort timer it may have armed stays armed
        self._cancel_timers()
        if abort:
            transport.abort()
            return
        self.flush()
        unsent = transport.get_write_buffer_size()
        transport.close()
        if unsent:  # closed at once otherwise: no timer for most connections
            self._linger_timer = self._loop.call_later(
                self.limits.client_timeout, self._close, True
            )

    def _linger(self) -> None:
        """An answer sent before the request's body was read: half-close and read the rest
        away (`LINGER_SECONDS`, `LINGER_BYTES`), so the kernel does not reset a client that
        reads only once it has sent all (curl, most libraries): nginx's lingering close."""
        self.closing = True
        self._cancel_timers()
        self.flush()
        transport = self.transport
        if transport is None or transport.is_closing() or self.gone:
            return
        if not transport.can_write_eof():  # TLS: no half-close; close after the answer
            transport.close()
            return
        self._lingering = True
        try:
            transport.write_eof()
        except OSError:  # the client reset meanwhile (asyncio's loop raises; uvloop does not)
            self._close(abort=True)
            return
        self._paused.clear()
        transport.resume_reading()
        self._linger_timer = self._loop.call_later(LINGER_SECONDS, self._close, True)

    def _read_away(self, size: int) -> None:
        """`size` more bytes of a body nobody will read (`_linger`), within `LINGER_BYTES`."""
        self._lingered += size
        if self._lingered > LINGER_BYTES:
            self._close(abort=True)

    def _cancel_timers(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
