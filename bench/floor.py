"""The floor under the ingress: the least a proxy on the ingress's own stack (Python, uvloop,
httptools) does for a request, measured beside nginx and the ingress (`bench.proxy`,
`bench.ladder`).

It parses each request head with httptools, writes a new head to the sandbox (the client's
headers, hop-by-hop `Connection` dropped, `X-Forwarded-For` added) over a kept connection from
a pool, and copies the answer back as it comes (with `Connection: close` put in when the
client asked for it, and the connection closed after), its end found by httptools' response
parser. All of it in the loop's callbacks, interpreted: no task, no future, no routing, no
lease, no metrics, no timeouts. Not a proxy anyone should run: GETs without bodies and answers
framed by Content-Length only (the benchmarks' sandbox's), no 1xx. What the stack costs before
any of the ingress's own work, so that a figure of the ingress's can be split into the stack's
and its own.

With `--rules`, the same callbacks call five of the ingress's compiled header rules:
`read_request_head` (one Host required, the head's size bounded), `new_request_id` (unless the
client sent one), `upstream_request_headers` (hop-by-hop dropped, X-Forwarded-* and the id
set), `framing_refused` and `client_response_headers` on the answer's head, which is written
anew and sent with the first body bytes; a use is counted per host while the exchange lasts.
The glue around them (the header loops, the lower-casing, the head joined) is this module's,
interpreted, where the ingress runs it compiled; and the ingress does more on each head than
these five (`frame_request`, the answer's Content-Length kept, `judge_status`): what
`floor+rules` adds to the floor is a rough price of those rules, not a bound either way.

    python -m bench.floor LISTEN_PORT SANDBOX_PORT [--rules]  # a subprocess of the benches
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

CLOSING = b"Connection: close\r\n"


class _Upstream(asyncio.Protocol):
    """A kept connection to the sandbox, carrying one exchange at a time for `client`; back in
    the pool once its answer was read to the end, never while broken."""

    def __init__(self, pool: list[_Upstream]) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.transport: asyncio.Transport | None = None
        self._pending = b""
        self.connecting: asyncio.Task[object] | None = None
        self.broken = False

    def connected(self, connecting: asyncio.Task[object]) -> None:
        self.connecting = None
        if connecting.exception() is not None:
            self.broken = True
            if self.client is not None:
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
        if not self.broken:
            self._pool.append(self)
        if client is not None:
            client.done()

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
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
        self.keep_alive = True
        self._opening = False
        """The next bytes relayed start an answer (its status line)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._peer = transport.get_extra_info("peername")[0].encode()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # an answer still coming for it is dropped

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_url(self, url: bytes) -> None:
        self._url += url  # a target split across reads comes in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() != b"connection":  # this hop's; the sandbox's connection is kept
            self._lines.append(name + b": " + value)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()  # llhttp forgets it after
        self._lines.append(b"X-Forwarded-For: " + self._peer)
        line = self._parser.get_method() + b" " + self._url + b" HTTP/1.1"
        head = line + b"\r\n" + b"\r\n".join(self._lines) + b"\r\n\r\n"
        self._lines, self._url = [], b""
        self._opening = not self.keep_alive
        self.take_upstream().send(head)

    def take_upstream(self) -> _Upstream:
        upstream = self._pool.pop() if self._pool else self._connect()
        upstream.client = self
        return upstream

    def _connect(self) -> _Upstream:
        return self._connect_with(_Upstream(self._pool))

    def _connect_with(self, upstream: _Upstream) -> _Upstream:
        loop = asyncio.get_running_loop()
        connect = loop.create_connection(lambda: upstream, *self._sandbox)
        upstream.connecting = loop.create_task(connect)
        upstream.connecting.add_done_callback(upstream.connected)
        return upstream

    def answer(self, data: bytes) -> None:
        if self._opening:  # the client asked to close: the answer says so, as nginx's does
            self._opening = False
            at = data.find(b"\r\n") + 2
            data = data[:at] + CLOSING + data[at:]
        if self._transport is not None:
            self._transport.write(data)

    def done(self) -> None:
        if not self.keep_alive:
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
        chunked = any(name.lower() == b"transfer-encoding" for name, _ in raw)
        if status < 200 or chunked or framing_refused(raw, False) is not None:
            self.broken = True  # not what this floor relays: both connections end
            if self.transport is not None:
                self.transport.abort()
            if self.client is not None:
                self.client.close()
                self.client = None
            return
        lines = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown" % status]
        for name, value in client_response_headers(raw, self.request_id):
            lines.append(name + b": " + value)
        if self.client is not None and not self.client.keep_alive:
            lines.append(b"connection: close")
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
        self._host: str | None = None
        """The host a use is counted for, while the exchange lasts."""

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.finished()  # gone mid-exchange: its use is over

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_message_complete(self) -> None:
        headers, self._headers = self._headers, []
        url, self._url = self._url, b""
        self.keep_alive = self._parser.should_keep_alive()
        head = read_request_head(headers)
        if head.hosts != 1 or len(url) + head.size > 32768:
            self.close()
            return
        request_id = head.client_request_id or new_request_id()
        self._host = head.host
        self._uses[head.host] += 1
        lines = [self._parser.get_method() + b" " + url + b" HTTP/1.1"]
        for name, value in upstream_request_headers(
            headers,
            client_ip=self._peer.decode(),
            scheme="http",
            request_id=request_id,
            trust_forwarded=False,
        ):
            lines.append(name + b": " + value)
        upstream = self.take_upstream()
        assert isinstance(upstream, _RuledUpstream)
        upstream.request_id = request_id
        upstream.send(b"\r\n".join(lines) + b"\r\n\r\n")

    def _connect(self) -> _Upstream:
        return self._connect_with(_RuledUpstream(self._pool))

    def finished(self) -> None:
        if self._host is not None:
            self._uses[self._host] -= 1
            self._host = None


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
