"""One request's connection to a sandbox, carried over a node's stream (or a relay to a peer
that holds one): an `asyncio.Transport`, so the upstream transport writes and parses HTTP over
it exactly as over TCP. One stream carries one exchange at a time; its messages are tagged, and
an answer under another exchange's tag (one the stream carried before) is dropped."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any, Protocol

from wakeful.aio.flow import HIGH_WATER
from wakeful.domain import tunnelwire as wire
from wakeful.ingress.errors import ConnectFailed


class TunnelClosed(ConnectionResetError):
    """The stream (or the relay) carrying an exchange broke."""


class Link(Protocol):
    """Where an exchange's messages go: a node's stream, or a relay call to a peer."""

    what: str

    async def send(self, message: bytes) -> None: ...


class Receiver(Protocol):
    """What a stream's reader hands the messages of the exchange in progress to."""

    def on_message(self, message: bytes) -> None: ...

    def on_lost(self, exc: BaseException) -> None: ...

    def readable(self) -> bool: ...

    async def wait_readable(self) -> None: ...


class Exchange(asyncio.Transport):
    """One request's connection to a sandbox, carried over a tunnel stream.

    To the upstream transport's protocol it is a TCP connection: `write`, `close`, `abort`,
    flow control both ways. `release(reuse)` ends it as a pooled connection would be given
    back (the node may keep its socket to the sandbox for the next exchange). When it ends,
    END goes to the node after whatever was queued (nothing after an abort); `on_over` runs
    once END is sent (the stream is free: the node reads END before anything after it), or at
    once if nothing was ever sent. Answers carrying another exchange's tag are dropped."""

    def __init__(
        self,
        link: Link,
        sandbox: str,
        protocol: asyncio.Protocol,
        on_over: Callable[[], None],
        tag: int = 0,
    ) -> None:
        super().__init__()
        self.tag = tag
        self._loop = asyncio.get_running_loop()
        self._link = link
        self._sandbox = sandbox
        self._protocol: asyncio.Protocol | None = protocol
        self._on_over: Callable[[], None] | None = on_over
        self._outbox: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._high = HIGH_WATER
        self._writing_paused = False
        self._connect_sent = False
        self._end: bool | None = None
        self._end_sent = False
        self._pump: asyncio.Task[None] | None = None
        self._reading = asyncio.Event()
        self._reading.set()
        protocol.connection_made(self)

    # -- asyncio.Transport ------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._protocol is None or self._end is not None or not data:
            return
        self._outbox.append(bytes(data))
        self._queued += len(data)
        if not self._writing_paused and self._queued > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()
        self._kick()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self._protocol is None

    def close(self) -> None:
        protocol = self._detach()
        if protocol is not None:
            self._finish(reuse=False)
            self._loop.call_soon(protocol.connection_lost, None)

    def abort(self) -> None:
        protocol = self._detach()
        if protocol is not None:
            self._outbox.clear()
            self._queued = 0
            self._finish(reuse=False)
            self._loop.call_soon(protocol.connection_lost, None)

    def release(self, reuse: bool) -> None:
        """The exchange ended cleanly: no `connection_lost`; the node may keep its socket."""
        if self._detach() is not None:
            self._finish(reuse=reuse)

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is not None:
            self._high = high

    def get_write_buffer_size(self) -> int:
        return self._queued

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._link.what, 0)
        return default

    # -- from the stream ----------------------------------------------------------------------

    def readable(self) -> bool:
        return self._reading.is_set() or self._protocol is None

    async def wait_readable(self) -> None:
        await self._reading.wait()

    def on_message(self, message: bytes) -> None:
        kind = message[0]
        if kind not in wire.ANSWERS or len(message) < 2:
            raise wire.WireError(f"unexpected message kind {kind!r} during an exchange")
        if message[1] != self.tag:
            return  # an answer of an exchange this stream carried before: dropped
        protocol = self._protocol
        if protocol is None:
            return
        if kind == wire.DATA:
            protocol.data_received(message[2:])
        elif kind == wire.REFUSED:
            reason = message[2:].decode(errors="replace")
            self._lost(ConnectFailed(f"{self._link.what}: {reason}"))
        else:  # FIN, DATA_FIN
            if kind == wire.DATA_FIN:
                protocol.data_received(message[2:])
            if self._protocol is not None:  # it may have ended the exchange itself
                protocol.eof_received()
                self._lost(None)

    def on_lost(self, exc: BaseException) -> None:
        """The stream broke: the exchange with it."""
        self._on_over = None  # the stream is gone: nothing goes back to the idle list
        if self._protocol is not None:
            if self._connect_sent:
                self._lost(TunnelClosed(f"{self._link.what} broke: {exc}"))
            else:  # nothing was sent: nothing reached the sandbox
                self._lost(ConnectFailed(f"{self._link.what} broke before the request: {exc}"))
        if self._pump is not None:
            self._pump.cancel()

    # -- internals ----------------------------------------------------------------------------

    def _detach(self) -> asyncio.Protocol | None:
        protocol, self._protocol = self._protocol, None
        self._reading.set()
        return protocol

    def _lost(self, exc: Exception | None) -> None:
        protocol = self._detach()
        if protocol is not None:
            self._finish(reuse=False)
            protocol.connection_lost(exc)

    def _finish(self, reuse: bool) -> None:
        if self._end is not None:
            return
        self._end = reuse
        if not self._connect_sent and not self._outbox:
            self._over()  # nothing reached the stream: it is idle as it was
        else:
            self._kick()

    def _over(self) -> None:
        on_over, self._on_over = self._on_over, None
        if on_over is not None:
            on_over()

    def _kick(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = self._loop.create_task(self._send_queued())

    async def _send_queued(self) -> None:
        try:
            while self._outbox:
                parts: list[bytes] = []
                size = 0
                while self._outbox and size < wire.CHUNK:
                    part = self._outbox.popleft()
                    parts.append(part)
                    size += len(part)
                payload = b"".join(parts)
                self._queued -= len(payload)
                for start in range(0, len(payload), wire.CHUNK):
                    piece = payload[start : start + wire.CHUNK]
                    if self._connect_sent:
                        await self._link.send(wire.data(piece))
                    else:
                        self._connect_sent = True
                        await self._link.send(wire.connect(self.tag, self._sandbox, piece))
                protocol = self._protocol
                if self._writing_paused and self._queued <= self._high // 4:
                    self._writing_paused = False
                    if protocol is not None:
                        protocol.resume_writing()
            if self._end is not None and not self._end_sent and self._connect_sent:
                self._end_sent = True
                await self._link.send(wire.end(self._end))
                self._over()  # END is on its way: the stream can carry the next exchange
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.on_lost(exc)
