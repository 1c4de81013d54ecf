"""What an upstream connection is built on, whatever its kind: where a pooled one rests
between exchanges (`Home`), who hears of its exchange when no task waits for it (`Listener`),
and how its writes are bounded (`Gated`, `tuned`). `upstream.connection` (HTTP/1.1),
`upstream.handshake` (a WebSocket's) and `upstream.h2c` build on these.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from wakeful.aio.flow import HIGH_WATER, WriteGate

if TYPE_CHECKING:
    from wakeful.ingress.upstream.connection import UpstreamConnection


class Home:
    """Where a connection goes between exchanges (`upstream.pool`'s `Pool`). A base class
    rather than a protocol: compiled, `give_back` (once a request) is a direct call."""

    def give_back(self, conn: UpstreamConnection) -> None:
        raise NotImplementedError

    def forget(self, conn: UpstreamConnection) -> None:
        raise NotImplementedError


class Listener:
    """Told, in place of a future, whenever an exchange may have moved on
    (`UpstreamConnection.begin`): after every read (its head or body came, it ended, the
    connection refused what came), at the end of an answer framed by the connection's close,
    and when it failed or fell silent. The direct path (`ingress.direct`) relays the answer
    from there, without a task, and looks at what changed (it may be nothing). Never told from
    inside the parser's callbacks, so it may end the exchange (`done`) when it is told."""

    def moved(self) -> None:
        raise NotImplementedError


class Gated(asyncio.Protocol):
    """A sandbox connection whose writes wait at `_writable` while the transport is full."""

    _writable: WriteGate

    def pause_writing(self) -> None:
        self._writable.close()

    def resume_writing(self) -> None:
        self._writable.open()


def tuned(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """An upstream connection as both kinds use it: writes bounded. No Nagle delay either,
    which both loops already set on every TCP transport (tests/ingress/test_nodelay.py)."""
    transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass
    transport.set_write_buffer_limits(high=HIGH_WATER)
    return transport
