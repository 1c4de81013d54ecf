"""The floor under the ingress: the least a proxy on the ingress's own stack (Python, uvloop,
httptools) does for a request, measured beside nginx and the ingress in `bench.proxy`.

It parses each request head with httptools, writes a new head to the sandbox (the client's
headers, `X-Forwarded-For` added) over a kept connection from a pool, and copies the answer
back as it comes, its end found by httptools' response parser. All of it in the loop's
callbacks: no task, no future, no routing, no lease, no metrics, no timeouts, no bodies from
clients. Not a proxy anyone should run; what the interpreter costs before any of the ingress's
own work, so that a figure of the ingress's can be split into the stack's and its own.

With `--rules`, the same callbacks apply the ingress's own compiled header rules
(`wakeful.ingress.headers`, `upstream.rules`): the Host counted and required, the request id
taken or made, hop-by-hop headers dropped both ways, X-Forwarded-* set, the answer's framing
checked, its head written anew and sent with the first body bytes, a use counted per host
while the exchange lasts. Still no task, lease cache, routing table, metrics or timers: what
the rules a lean path must keep cost on top of the floor.

    python -m bench.floor LISTEN_PORT SANDBOX_PORT [--rules]  # a subprocess of bench.proxy
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.floor")

import asyncio
from collections import defaultdict
from typing import cast

import httptools

from wakeful.ingress.headers import (
    client_response_headers,
    new_request_id,
    read_request_head,
    upstream_request_headers,
)
from wakeful.ingress.http1.responder import _STATUS_LINES
from wakeful.ingress.upstream.rules import framing_refused


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
        return self._connect_with(_Upstream(self._pool))

    def _connect_with(self, upstream: _Upstream) -> _Upstream:
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


class _RuledUpstream(_Upstream):
    """The answer's head read, checked and written anew (`client_response_headers`), sent
    with its first body bytes, as the ingress sends it."""

    def __init__(self, pool: list[_Upstream]) -> None:
        super().__init__(pool)
        self._raw: list[tuple[bytes, bytes]] = []
        self._held: bytes | None = None
        self.request_id = ""

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        raw, self._raw = self._raw, []
        status = self._parser.get_status_code()
        if framing_refused(raw, status < 200) is not None:
            if self.client is not None:
                self.client.close()
            return
        lines = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown" % status]
        for name, value in client_response_headers(raw, self.request_id):
            lines.append(name + b": " + value)
        self._held = b"\r\n".join(lines) + b"\r\n\r\n"

    def on_body(self, body: bytes) -> None:
        if self._held is not None:
            body, self._held = self._held + body, None
        if self.client is not None:
            self.client.answer(body)

    def on_message_complete(self) -> None:
        if self._held is not None:
            self.on_body(b"")
        client = self.client
        if isinstance(client, _RuledClient):
            client.finished()
        super().on_message_complete()


class _RuledClient(_Client):
    def __init__(
        self, pool: list[_Upstream], sandbox: tuple[str, int], uses: dict[str, int]
    ) -> None:
        super().__init__(pool, sandbox)
        self._headers: list[tuple[bytes, bytes]] = []
        self._uses = uses
        self._host = ""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_message_complete(self) -> None:
        headers, self._headers = self._headers, []
        self._keep_alive = self._parser.should_keep_alive()
        head = read_request_head(headers)
        if head.hosts != 1 or len(self._url) + head.size > 32768:
            self.close()
            return
        request_id = head.client_request_id or new_request_id()
        self._host = head.host
        self._uses[head.host] += 1
        lines = [self._parser.get_method() + b" " + self._url + b" HTTP/1.1"]
        for name, value in upstream_request_headers(
            headers,
            client_ip=self._peer.decode(),
            scheme="http",
            request_id=request_id,
            trust_forwarded=False,
        ):
            lines.append(name + b": " + value)
        upstream = self._pool.pop() if self._pool else self._connect()
        assert isinstance(upstream, _RuledUpstream)
        upstream.client = self
        upstream.request_id = request_id
        upstream.send(b"\r\n".join(lines) + b"\r\n\r\n")

    def _connect(self) -> _Upstream:
        return self._connect_with(_RuledUpstream(self._pool))

    def finished(self) -> None:
        self._uses[self._host] -= 1


def main(port: int, sandbox_port: int, rules: bool) -> None:
    import uvloop

    async def serve() -> None:
        pool: list[_Upstream] = []
        sandbox = ("127.0.0.1", sandbox_port)
        uses: dict[str, int] = defaultdict(int)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            (lambda: _RuledClient(pool, sandbox, uses))
            if rules
            else lambda: _Client(pool, sandbox),
            "127.0.0.1",
            port,
            backlog=4096,
        )
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), "--rules" in sys.argv[3:])
