"""WebSockets through the ingress: the handshake is proxied like any request, then bytes go both
ways until either side ends.

A client's `GET` with `Connection: upgrade` and `Upgrade: websocket` (`is_websocket`, in
`http1.rules`) takes a lease use like any request and is sent to the sandbox on a connection of
its own (never a pooled one) with those two headers kept. A `101` answer splices both
connections: `splice` copies what each side sends to the other, with backpressure each way (a
`Pipe` stops reading from its side past `HIGH_WATER` bytes not yet written to the other), until
one side closes, nothing has crossed for the app's idle timeout, or the WebSocket has lasted
its maximum duration. Any other answer to the handshake (a 400, a 426, a redirect) is passed on
as it is, its body bounded by `MAX_REFUSAL_BYTES`, and the client connection closes after it.

The request's lease use is held for the WebSocket's whole life: the sandbox counts the socket
as a request in flight (seed 001), the lease cache renews the lease as used, so the activator
records activity and the idle monitor never scales an app with an open WebSocket to zero,
and the pool controller never stops a sandbox that still carries one (it drains it last).
A WebSocket holds an upstream exchange slot only for its handshake: WebSockets are bounded by
the ingress's client connections (`max_client_connections`), not by `upstream_connections`.
Other `Upgrade` tokens (`h2c`, ...) and an HTTP/1.0 handshake are not switched to: the request
is answered as a plain one (the upgrade headers are hop-by-hop and dropped), after whatever was
pipelined before it, and the connection closes after it. `CONNECT` is refused (400). Whatever
a sandbox writes after its answer to a handshake is never taken for an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from wakeful.aio.pipe import Pipe

MAX_REFUSAL_BYTES = 64 * 1024
"""The body of a handshake answered with anything but 101, passed on whole."""


class Side(Protocol):
    """One end of a spliced WebSocket: what it sent, and how to send to it."""

    @property
    def pipe(self) -> Pipe: ...

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None:
        """Wait until the side's socket buffer has room; raises when it is gone or, for a
        client, when it reads nothing for the client timeout."""
        ...


async def splice(client: Side, sandbox: Side, idle: float, max_duration: float) -> str:
    """Copy both ways until a side ends, nothing crossed for `idle` seconds, or `max_duration`
    passed; returns why it ended ("client closed", "sandbox closed", "idle", "max duration",
    or the error that broke a side). The caller closes both connections."""
    loop = asyncio.get_running_loop()
    last = loop.time()

    async def copy(source: Side, target: Side, name: str) -> str:
        nonlocal last
        while chunk := await source.pipe.get():
            last = loop.time()
            target.write(chunk)
            await target.drain()
        return f"{name} closed"

    async def quiet() -> str:
        while True:  # sleeps until `idle` after the last byte; the copies move `last` on
            left = last + idle - loop.time()
            if left <= 0:
                return "idle"
            await asyncio.sleep(left)

    tasks = [
        loop.create_task(copy(client, sandbox, "client")),
        loop.create_task(copy(sandbox, client, "sandbox")),
        loop.create_task(quiet()),
    ]
    # No `await` in a `finally` (nor after an exception in flight): compiled, mypyc loses the
    # exception a cancellation threw in and the coroutine returns None (mypyc/mypyc#1114).
    try:
        done, _ = await asyncio.wait(tasks, timeout=max_duration, return_when="FIRST_COMPLETED")
    except BaseException:
        for task in tasks:
            task.cancel()  # they end on their next turn
        raise
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not done:
        return "max duration"
    first = done.pop()
    error = first.exception()
    return first.result() if error is None else f"broken: {error}"


def upgrade_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A 101's headers for the client: the sandbox's end-to-end ones (hop-by-hop already
    dropped, and no body framing: a 1xx has no body) and the two that switch this hop."""
    kept = [(name, value) for name, value in headers if name != b"content-length"]
    return [*kept, (b"connection", b"upgrade"), (b"upgrade", b"websocket")]
