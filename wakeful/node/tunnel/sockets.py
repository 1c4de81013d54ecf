"""The node's end of an exchange: a socket to one of its own sandboxes, and the sockets kept
between exchanges.

A socket the ingress says may be reused (its answer was whole) is kept for the next exchange
to the same sandbox for `SOCKET_KEEPALIVE` seconds, at most `MAX_KEPT_PER_SANDBOX` of them; a
socket the sandbox closed, or sent bytes on that nobody asked for, is never reused.
"""

from __future__ import annotations

import asyncio
import contextlib

from wakeful.aio.pipe import Pipe
from wakeful.domain import tunnelwire as wire

SOCKET_KEEPALIVE = 4.0
"""A sandbox socket kept for the next exchange is closed after this long (below uvicorn's 5 s)."""
MAX_KEPT_PER_SANDBOX = 8
CONNECT_TIMEOUT = 5.0
WRITE_STALL = 60.0
"""Seconds a sandbox may leave a request's bytes unread (the ingress's `client_timeout`)."""


class SandboxSocket(asyncio.Protocol):
    """A socket to a sandbox: what it sent, waiting to go up the stream (`received`, bounded);
    writes with flow control."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = Pipe(self._pause_reading, self._resume_reading)
        self.closed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.expiry: asyncio.TimerHandle | None = None

    @property
    def eof(self) -> bool:
        """The sandbox sent all it will (what it sent may still wait in `received`)."""
        return self.received.ended

    @property
    def spoiled(self) -> bool:
        """Not fit for another exchange: closed, or the sandbox ended or sent unasked bytes."""
        return self.closed or self.received.ended or self.received.size > 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received.feed(data)

    def eof_received(self) -> bool:
        self.received.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        self.received.end()

    def _pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def read(self) -> bytes:
        """The next bytes the sandbox sent, at most what one message carries; b"" once it
        closed."""
        return await self.received.get(wire.CHUNK)

    async def write(self, data: bytes) -> None:
        """Write; wait while the sandbox does not read, at most `WRITE_STALL` seconds, then
        give up on it (the socket is aborted): the stream must get back to reading its END."""
        if self.closed or self.transport is None:
            return
        self.transport.write(data)
        if self._writable.is_set():
            return
        try:
            async with asyncio.timeout(WRITE_STALL):
                await self._writable.wait()
        except TimeoutError:
            self.transport.abort()
            self.closed = True

    def close(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
        if self.transport is not None:
            self.transport.close()
        self.closed = True


async def open_socket(target: tuple[str, int]) -> SandboxSocket | None:
    """A new socket to the sandbox at `target`; None when it cannot be reached in
    `CONNECT_TIMEOUT`."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            _, sock = await loop.create_connection(SandboxSocket, target[0], target[1])
    except (OSError, TimeoutError):
        return None
    return sock


class KeptSockets:
    """Sockets kept between exchanges, per sandbox."""

    def __init__(self) -> None:
        self._kept: dict[str, list[SandboxSocket]] = {}

    def take(self, sandbox: str) -> SandboxSocket | None:
        kept = self._kept.get(sandbox)
        while kept:
            sock = kept.pop()
            if sock.expiry is not None:
                sock.expiry.cancel()
            if not sock.spoiled:
                return sock
            sock.close()
        return None

    def keep(self, sandbox: str, sock: SandboxSocket) -> None:
        kept = self._kept.setdefault(sandbox, [])
        if len(kept) >= MAX_KEPT_PER_SANDBOX or sock.spoiled:
            sock.close()
            return
        kept.append(sock)

        def expire() -> None:
            with contextlib.suppress(ValueError):
                kept.remove(sock)
            sock.close()
            if not kept and self._kept.get(sandbox) is kept:
                del self._kept[sandbox]

        sock.expiry = asyncio.get_running_loop().call_later(SOCKET_KEEPALIVE, expire)

    def close(self) -> None:
        for kept in self._kept.values():
            for sock in kept:
                sock.close()
        self._kept.clear()
