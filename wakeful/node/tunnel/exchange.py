"""What a stream carries: exchanges, one at a time, each a byte pipe between the stream and a
socket on one of this node's own sandboxes.

The CONNECT names a sandbox id, and `targets` answers with its local address only for a
sandbox this agent runs and has seen ready. Nothing else on the node's network is reachable
through a tunnel. The sandbox's bytes go up the stream as they come; the request's come down
until its END, which says whether the socket may serve the next exchange (`KeptSockets`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import websockets
from websockets.asyncio.client import ClientConnection

from wakeful.domain import tunnelwire as wire

from .sockets import KeptSockets, SandboxSocket, open_socket

Targets = Callable[[str], tuple[str, int] | None]


class Stream:
    """One stream: its call, the replica it landed on, and what it carries."""

    def __init__(self, sid: int, opened_at: float) -> None:
        self.id = sid
        self.connection: ClientConnection | None = None
        self.replica = ""
        self.opened_at = opened_at
        self.last_used = opened_at
        self.busy = False
        self.closing = False
        self._lock = asyncio.Lock()

    async def send(self, message: bytes) -> None:
        assert self.connection is not None
        async with self._lock:
            await self.connection.send(message)

    async def recv(self) -> bytes | None:
        """The next message; None once the stream closed."""
        assert self.connection is not None
        try:
            message = await self.connection.recv()
        except websockets.ConnectionClosed:
            return None
        if not isinstance(message, bytes):
            raise wire.WireError("a text message on a tunnel")
        return message


class Carrier:
    """Serves the exchanges of every stream of this node, with the sockets they keep."""

    def __init__(self, node: str, targets: Targets, clock: Callable[[], float]) -> None:
        self.node = node
        self._targets = targets
        self._clock = clock
        self._sockets = KeptSockets()

    def close(self) -> None:
        """Close the kept sockets (the client stops)."""
        self._sockets.close()

    async def carry(self, stream: Stream) -> None:
        """Serve the stream's exchanges until it ends."""
        while True:
            message = await stream.recv()
            if not message:
                return
            kind = message[0]
            if kind == wire.DRAINED:
                return  # out of use on the replica: closed in `TunnelClient._open_stream`
            if kind != wire.CONNECT:
                raise wire.WireError(f"message kind {kind!r} on an idle stream")
            stream.busy = True
            try:
                await self._exchange(stream, message)
            finally:
                stream.busy = False
                stream.last_used = self._clock()

    async def _exchange(self, stream: Stream, first: bytes) -> None:
        """One exchange: a socket to the sandbox it names, bytes both ways, until END."""
        tag, sandbox, data = wire.read_connect(first)
        sock = await self._connect(sandbox)
        if sock is None:
            reason = f"node {self.node!r} cannot reach sandbox {sandbox!r}"
            await stream.send(wire.refused(tag, reason))
            await _until_end(stream)
            return
        if data:
            await sock.write(data)
        state = {"sending": False, "stop": False, "dirty": False}

        async def upward() -> None:
            while True:
                chunk = await sock.read()
                if state["stop"]:
                    state["dirty"] = True  # bytes after the answer: the socket is spoiled
                    return
                last = not chunk or (sock.eof and not sock.received.size)
                if not chunk:
                    message = wire.answer(wire.FIN, tag)
                elif last:  # the answer and the close in one message (an HTTP/1.0 sandbox)
                    message = wire.answer(wire.DATA_FIN, tag, chunk)
                else:
                    message = wire.answer(wire.DATA, tag, chunk)
                state["sending"] = True
                try:
                    await stream.send(message)
                finally:
                    state["sending"] = False
                if last or state["stop"]:
                    return

        pump = asyncio.get_running_loop().create_task(upward())
        reuse = False
        try:
            while True:
                message = await stream.recv()
                if not message:
                    raise wire.WireError("the stream ended mid-exchange")
                kind = message[0]
                if kind == wire.DATA:
                    await sock.write(message[1:])
                elif kind == wire.END:
                    reuse = message[1:] == b"1"
                    break
                else:
                    raise wire.WireError(f"message kind {kind!r} during an exchange")
        finally:
            state["stop"] = True
            if not state["sending"]:
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            if reuse and not state["dirty"]:
                self._sockets.keep(sandbox, sock)  # it checks the sandbox kept quiet
            else:
                sock.close()

    async def _connect(self, sandbox: str) -> SandboxSocket | None:
        target = self._targets(sandbox)
        if target is None:
            return None
        kept = self._sockets.take(sandbox)
        if kept is not None:
            return kept
        return await open_socket(target)


async def _until_end(stream: Stream) -> None:
    """After a REFUSED: the request's bytes are dropped until its END."""
    while True:
        message = await stream.recv()
        if not message:
            raise wire.WireError("the stream ended mid-exchange")
        if message[0] == wire.END:
            return
