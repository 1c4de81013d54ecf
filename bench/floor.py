"""The floor under the ingress: the least a proxy on the ingress's own stack (Python, uvloop,
httptools) does for a request, measured beside nginx and the ingress in `bench.proxy`.

It parses each request head with httptools, writes a new head to the sandbox (the client's
headers, `X-Forwarded-For` added) over a kept connection from a pool, and copies the answer
back as it comes, its end found by httptools' response parser. All of it in the loop's
callbacks: no task, no future, no routing, no lease, no metrics, no timeouts, no bodies from
clients. Not a proxy anyone should run; what the interpreter costs before any of the ingress's
own work, so that a figure of the ingress's can be split into the stack's and its own.

    python -m bench.floor LISTEN_PORT SANDBOX_PORT   # a subprocess of bench.proxy
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.floor")

import asyncio
from typing import cast

import httptools


class _Upstream(asyncio.Protocol):
    """A kept connection to the sandbox, carrying one exchange at a time for `client`."""

    def __init__(self, pool: list[_Upstream]) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.transport: asyncio.Transport | None = None
        self._pending = b""
        self.connecting: asyncio.Task[object] | None = None

    def connected(self, connecting: asyncio.Task[object]) -> None:
        self.connecting = None
        if connecting.exception() is not None and self.client is not None:
            self.client.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self._pending:
            self.transport.write(self._pending)
            self._pending = b""

    def send(self, head: bytes) -> None:
        if self.transport is None:
            self._pending = head
        else:
            self.transport.write(head)

    def data_received(self, data: bytes) -> None:
        if self.client is not None:
            self.client.answer(data)
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self._pool.append(self)
        if client is not None:
            client.done()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self._pool:
            self._pool.remove(self)
        if self.client is not None:
            self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, pool: list[_Upstream], sandbox: tuple[str, int]) -> None:
        self._pool = pool
        self._sandbox = sandbox
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._lines: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._peer = b""
        self._keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._peer = transport.get_extra_info("peername")[0].encode()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_url(self, url: bytes) -> None:
        self._url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() != b"connection":  # this hop's; the sandbox's connection is kept
            self._lines.append(name + b": " + value)

    def on_message_complete(self) -> None:
        method = self._parser.get_method()
        self._keep_alive = self._parser.should_keep_alive()  # llhttp forgets it after
        self._lines.append(b"X-Forwarded-For: " + self._peer)
        head = method + b" " + self._url + b" HTTP/1.1\r\n" + b"\r\n".join(self._lines)
        self._lines = []
        upstream = self._pool.pop() if self._pool else self._connect()
        upstream.client = self
        upstream.send(head + b"\r\n\r\n")

    def _connect(self) -> _Upstream:
        upstream = _Upstream(self._pool)
        loop = asyncio.get_running_loop()
        connect = loop.create_connection(lambda: upstream, *self._sandbox)
        upstream.connecting = loop.create_task(connect)
        upstream.connecting.add_done_callback(upstream.connected)
        return upstream

    def answer(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def done(self) -> None:
        if self._transport is not None and not self._keep_alive:
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def main(port: int, sandbox_port: int) -> None:
    import uvloop

    async def serve() -> None:
        pool: list[_Upstream] = []
        sandbox = ("127.0.0.1", sandbox_port)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Client(pool, sandbox), "127.0.0.1", port, backlog=4096
        )
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
