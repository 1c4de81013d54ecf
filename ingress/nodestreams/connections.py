"""The WebSocket connections that nodes' streams and peers' relays ride on: their options, one
binary message read, and a close (or any coroutine) left to run on its own."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import ServerConnection

from wakeful.aio.tasks import Background
from wakeful.domain import tunnelwire as wire

WS_OPTIONS = wire.WEBSOCKET_OPTIONS


async def receive(connection: ServerConnection | ClientConnection) -> bytes | None:
    """The next message; None once the connection closed. Text is a protocol error."""
    try:
        message = await connection.recv()
    except websockets.ConnectionClosed:
        return None
    if not isinstance(message, bytes):
        raise wire.WireError("a text message on a tunnel")
    return message


_background = Background()
"""Work started from callbacks, held until it ends; what it raises is dropped."""


def spawn(coroutine: Coroutine[Any, Any, object]) -> None:
    """Run `coroutine` on its own, kept referenced until it ends; its errors are dropped."""
    _background.spawn(coroutine)
