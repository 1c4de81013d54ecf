"""Request heads as bytes through the real HTTP/1.1 server (llhttp, then `frame_request`):
what a handler is given for each shape, or the 400 that refuses it before any handler runs.
The parser refuses most smuggling shapes itself; the table says what reaches a handler."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest

from wakeful.ingress.http1 import Handling, HttpServer, Limits, Request, Responder

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Seen:
    """What the handler was given."""

    method: str
    body: bytes | None
    upgrade: bool = False
    keep_alive: bool = True


REFUSED = None
"""A 400 from the server itself; no handler ran."""


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.versions: list[str] = []
        self.refused: list[str] = []

    async def handle(self, request: Request, out: Responder) -> None:
        body = None
        if request.body is not None:
            body = b"".join([chunk async for chunk in request.body.stream()])
        self.seen.append(Seen(request.method, body, request.upgrade, request.keep_alive))
        self.versions.append(request.version)
        out.send_whole(200, [], b"ok")


@asynccontextmanager
async def _serving() -> AsyncIterator[tuple[int, _Recorder]]:
    recorder = _Recorder()
    server = HttpServer(
        Handling(recorder.handle),
        Limits(head_timeout=30, client_timeout=5),
        refused=recorder.refused.append,
    )
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    await server.start(sock, 16)
    try:
        yield int(sock.getsockname()[1]), recorder
    finally:
        await server.stop(0)


def _send(port: int, data: bytes) -> bytes:
    """Send `data`, half-close, read until the server closes (a reset ends it too)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
                if got.startswith(b"HTTP/1.1 400") or got.endswith(b"ok"):
                    break
        except ConnectionResetError:
            pass
    return got


def head(method: bytes, *lines: bytes, version: bytes = b"1.1") -> bytes:
    return b"%s / HTTP/%s\r\nHost: x\r\n%s\r\n" % (
        method,
        version,
        b"".join(line + b"\r\n" for line in lines),
    )


CHUNKED_HELLO = b"5\r\nhello\r\n0\r\n\r\n"
TE = b"Transfer-Encoding: "
CL = b"Content-Length: "
WS = (b"Connection: Upgrade", b"Upgrade: websocket")

SHAPES = [
    # -- refused by the parser before the rules see them -----------------------------------
    pytest.param(head(b"POST", CL + b"5", TE + b"chunked") + b"0\r\n\r\n", REFUSED, id="CL, TE"),
    pytest.param(head(b"POST", TE + b"chunked", CL + b"5") + b"0\r\n\r\n", REFUSED, id="TE, CL"),
    pytest.param(head(b"POST", CL + b"5", CL + b"5") + b"hello", REFUSED, id="two equal CLs"),
    pytest.param(head(b"POST", CL + b"5", CL + b"6") + b"hello!", REFUSED, id="two CLs"),
    pytest.param(head(b"POST", CL + b"+5") + b"hello", REFUSED, id="CL with a sign"),
    pytest.param(head(b"POST", CL + b"5 5") + b"hello", REFUSED, id="CL with a space inside"),
    pytest.param(head(b"POST", CL), REFUSED, id="empty CL"),
    pytest.param(head(b"POST", TE + b"chunked, identity"), REFUSED, id="chunked, identity"),
    pytest.param(head(b"POST", TE + b"chunked", TE + b"chunked"), REFUSED, id="two TEs"),
    pytest.param(head(b"GET", b"X-A: a", b" b"), REFUSED, id="obs-fold"),
    pytest.param(head(b"POST", TE, b" chunked") + b"0\r\n\r\n", REFUSED, id="obs-fold in TE"),
    pytest.param(b"GET / HTTP/1.1\nHost: x\n\n", REFUSED, id="bare LF"),
    pytest.param(head(b"GET", b"X : a"), REFUSED, id="space before the colon"),
    pytest.param(head(b"GET", b"X: a\x00b"), REFUSED, id="NUL in a value"),
    pytest.param(head(b"GET", version=b"1.2"), REFUSED, id="HTTP/1.2"),
    # -- refused by the rules (the parser lets them through) -------------------------------
    pytest.param(head(b"POST", TE + b"gzip, chunked") + b"0\r\n\r\n", REFUSED, id="gzip, chunked"),
    pytest.param(head(b"POST", TE + b"identity"), REFUSED, id="identity"),
    # -- served ------------------------------------------------------------------------------
    pytest.param(
        head(b"POST", CL + b"005") + b"hello", Seen("POST", b"hello"), id="CL with leading zeros"
    ),
    pytest.param(
        head(b"POST", CL + b" 5 ") + b"hello", Seen("POST", b"hello"), id="CL, spaces around"
    ),
    pytest.param(
        head(b"POST", TE + b"Chunked") + CHUNKED_HELLO, Seen("POST", b"hello"), id="Chunked"
    ),
    pytest.param(
        head(b"POST", TE + b"chunked", version=b"1.0") + CHUNKED_HELLO,
        Seen("POST", b"hello", keep_alive=False),
        id="chunked in HTTP/1.0",
    ),
    pytest.param(
        head(b"POST", b"Expect: 200-ok", CL + b"5") + b"hello",
        Seen("POST", b"hello"),
        id="another expectation",
    ),
    pytest.param(
        head(b"GET", b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: A"),
        Seen("GET", None, keep_alive=False),
        id="h2c: plain, and the connection closes after",
    ),
    pytest.param(
        head(b"GET", *WS, version=b"1.0"),
        Seen("GET", None, keep_alive=False),
        id="WebSocket in HTTP/1.0: plain",
    ),
    pytest.param(
        head(b"GET", *WS),
        Seen("GET", None, upgrade=True, keep_alive=False),
        id="WebSocket handshake",
    ),
    # llhttp takes the bytes after an upgrade request's head for the new protocol, so the
    # body announced would never come: the sandbox, told Content-Length 5, read the next
    # request on its pooled connection as the rest of this body. Refused instead.
    pytest.param(
        head(b"POST", b"Connection: Upgrade", b"Upgrade: foo", CL + b"5") + b"hello",
        REFUSED,
        id="an upgrade with a body: refused, never a desynchronised pooled connection",
    ),
    pytest.param(
        head(b"POST", b"Connection: Upgrade", b"Upgrade: foo", b"Transfer-Encoding: chunked")
        + b"5\r\nhello\r\n0\r\n\r\n",
        REFUSED,
        id="an upgrade with a chunked body: refused",
    ),
]


@pytest.mark.parametrize(("data", "expected"), SHAPES)
async def test_what_each_head_shape_gets(data: bytes, expected: Seen | None) -> None:
    async with _serving() as (port, recorder):
        with anyio.fail_after(60):
            answer = await anyio.to_thread.run_sync(_send, port, data)
    if expected is REFUSED:
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert recorder.seen == []
        assert recorder.refused == ["malformed"]  # what the metrics count it as
    else:
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert recorder.seen == [expected]
        assert recorder.refused == []


@pytest.mark.parametrize(
    ("data", "version", "keep_alive"),
    [
        (head(b"GET"), "1.1", True),
        (head(b"GET", b"Connection: close"), "1.1", False),
        (head(b"GET", b"Connection: keep-alive"), "1.1", True),
        (head(b"GET", version=b"1.0"), "1.0", False),
        (head(b"GET", b"Connection: keep-alive", version=b"1.0"), "1.0", True),
        (head(b"GET", b"Connection: Keep-Alive, X-A", version=b"1.0"), "1.0", True),
        (head(b"GET", b"connection: keep-alive", version=b"2.0"), "2.0", True),
        (head(b"GET", b"Proxy-Connection: keep-alive", version=b"1.0"), "1.0", True),
        (head(b"GET", version=b"0.9"), "0.9", False),
    ],
)
async def test_a_handler_is_told_the_version_the_request_line_says(
    data: bytes, version: str, keep_alive: bool
) -> None:
    """The server tells 1.1 without asking the parser when the head needs no asking (kept
    alive with no Connection header: llhttp does that for 1.1 only, and reads
    Proxy-Connection as one); every other head's version is the parser's."""
    async with _serving() as (port, recorder):
        with anyio.fail_after(60):
            answer = await anyio.to_thread.run_sync(_send, port, data)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert recorder.versions == [version]
    assert recorder.seen[0].keep_alive is keep_alive
