"""A WebSocket sandbox for the ingress tests, on the `websockets` library (a real server, not
ours): it listens on $PORT and, per message, echoes it back; "headers" answers the handshake's
headers as JSON; "close" closes from the sandbox's side; "flood N" sends N bytes in 64 KiB
messages. A handshake to /refuse is answered 403; the count of open connections is served
at /open over plain HTTP."""

from __future__ import annotations

import asyncio
import http
import json
import os

from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

OPEN = 0
NOISE = os.urandom(65536)
"""What a flood sends: incompressible, so the bytes on the wire are the bytes counted."""


async def handler(ws: ServerConnection) -> None:
    global OPEN
    OPEN += 1
    try:
        async for message in ws:
            if message == "headers":
                assert ws.request is not None
                await ws.send(json.dumps({k.lower(): v for k, v in ws.request.headers.raw_items()}))
            elif message == "close":
                await ws.close(code=4000, reason="the sandbox closes")
            elif isinstance(message, str) and message.startswith("flood "):
                left = int(message.split()[1])
                while left > 0:
                    await ws.send(NOISE[: min(left, 65536)])
                    left -= 65536
            else:
                await ws.send(message)
    finally:
        OPEN -= 1


def gate(connection: ServerConnection, request: Request) -> Response | None:
    if request.path == "/refuse":
        return connection.respond(http.HTTPStatus.FORBIDDEN, "no WebSocket for you\n")
    if request.path == "/open":
        return connection.respond(http.HTTPStatus.OK, f"{OPEN}\n")
    return None


async def main() -> None:
    async with serve(handler, "127.0.0.1", int(os.environ["PORT"]), process_request=gate):
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
