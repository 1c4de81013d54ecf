"""The proxy port's HTTP/1.1 server: smuggling shapes refused (h11 as an independent oracle),
pipelined requests answered in order, HTTP/1.0 and HEAD framed right, a closing connection
whose client never reads aborted after its timeout."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

import anyio
import h11
import pytest

from tests.support.ingress import RawServer, read_head, responses, stack, talk
from wakeful.ingress.http1 import Handler, Handling, HttpServer, Limits, Request, Responder

pytestmark = pytest.mark.anyio


def _h11_refuses(data: bytes) -> bool:
    server = h11.Connection(h11.SERVER)
    server.receive_data(data)
    try:
        while True:
            event = server.next_event()
            if event is h11.NEED_DATA or isinstance(event, h11.EndOfMessage):
                return False
    except h11.RemoteProtocolError:
        return True


def _answer_anything(conn: socket.socket) -> None:
    read_head(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


SMUGGLING = {
    "content-length and transfer-encoding": (
        b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n"
    ),
    "two content-lengths": (
        b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nContent-Length: 5\r\n"
        b"Content-Length: 6\r\n\r\nhello!"
    ),
    "obs-fold": b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nX-A: a\r\n b\r\n\r\n",
    "bare LF": b"GET / HTTP/1.1\nHost: hello.localhost\n\n",
    "space before the colon": b"GET / HTTP/1.1\r\nHost : hello.localhost\r\n\r\n",
}
H11_REFUSES_TOO = {"two content-lengths", "space before the colon"}
"""h11 (an independent parser) refuses these as well; it tolerates the others (it unfolds
obs-fold, takes a bare LF, lets Transfer-Encoding win over Content-Length), which a proxy in
front of servers that may read them differently must not."""


@pytest.mark.parametrize("shape", SMUGGLING)
async def test_request_smuggling_shapes_are_refused_and_reach_no_sandbox(shape: str) -> None:
    request_bytes = SMUGGLING[shape]
    if shape in H11_REFUSES_TOO:
        assert _h11_refuses(request_bytes)
    with RawServer(_answer_anything) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], request_bytes)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert answer.count(b"HTTP/1.1") == 1  # nothing after it was read as a second request
    assert sandbox.connections == 0


class _Recorder:
    """A sandbox that keeps what it received and answers nothing until the ingress hangs up."""

    def __init__(self) -> None:
        self.received = b""

    def __call__(self, conn: socket.socket) -> None:
        while chunk := conn.recv(65536):
            self.received += chunk


async def test_a_malformed_chunked_body_fails_the_request_and_never_completes_upstream() -> None:
    bad_chunk = (
        b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\nzz\r\nworld\r\n0\r\n\r\n"
    )
    assert _h11_refuses(bad_chunk)
    recorder = _Recorder()
    with RawServer(recorder) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], bad_chunk)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    # The head went on before the body broke; the sandbox never saw the body end.
    assert b"world" not in recorder.received and not recorder.received.endswith(b"0\r\n\r\n")


async def test_pipelined_requests_are_answered_in_order(hello: Callable[[], int]) -> None:
    async with stack({"sb-1": hello()}) as s:
        pipelined = b"".join(
            b"GET /bytes?n=%d HTTP/1.1\r\nHost: hello.localhost\r\n%s\r\n"
            % (n, b"Connection: close\r\n" if n == 3 else b"")
            for n in (1, 2, 3)
        )
        answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], pipelined)
    assert responses(answer) == [(200, b"w"), (200, b"ww"), (200, b"www")]


async def test_http_1_0_and_head_answers_are_framed_right(hello: Callable[[], int]) -> None:
    async with stack({"sb-1": hello()}) as s:
        port = s.ingress.address[1]
        old = await anyio.to_thread.run_sync(
            talk, port, b"GET /bytes?n=4 HTTP/1.0\r\nHost: hello.localhost\r\n\r\n"
        )
        head = await anyio.to_thread.run_sync(
            talk,
            port,
            b"HEAD /bytes?n=4 HTTP/1.1\r\nHost: hello.localhost\r\nConnection: close\r\n\r\n",
        )
    assert old.startswith(b"HTTP/1.1 200") and old.endswith(b"\r\n\r\nwwww")
    assert b"connection: close" in old.lower()
    assert head.startswith(b"HTTP/1.1") and head.endswith(b"\r\n\r\n")  # a head, no body


class _Server:
    """The HTTP/1.1 server alone on loopback, answering with `handler`."""

    def __init__(self, handler: Handler, limits: Limits) -> None:
        self.server = HttpServer(handler, limits)
        self.port = 0

    async def __aenter__(self) -> _Server:
        sock = socket.create_server(("127.0.0.1", 0))
        sock.setblocking(False)
        self.port = int(sock.getsockname()[1])
        await self.server.start(sock, 16)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)


async def test_an_answer_without_a_body_goes_out_before_the_handler_returns() -> None:
    """The head held for the body's first bytes goes out when the answer ends without any:
    a 204 is not kept back while the handler still does its own work (a lease release)."""
    released = anyio.Event()

    class NoContent:
        async def handle(self, request: Request, out: Responder) -> None:
            out.start(204, [])
            out.end()
            await released.wait()

    async with _Server(Handling(NoContent().handle), Limits()) as served:

        def first_line() -> bytes:
            with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                return sock.recv(65536)

        with anyio.fail_after(30):
            line = await anyio.to_thread.run_sync(first_line)
        released.set()
    assert line.startswith(b"HTTP/1.1 204")


async def test_a_shutdown_while_the_last_answer_drains_closes_the_connection_after_it() -> None:
    """Stopping while a slow client still reads the last answer: the answer is read whole,
    then the connection closes (no new request is taken, and `stop` does not wait out its
    grace for a connection that has become idle)."""
    body = b"x" * (32 << 20)  # past what the two sockets buffer: the task waits to drain

    class Big:
        async def handle(self, request: Request, out: Responder) -> None:
            out.send_whole(200, [], body)

    async with _Server(Handling(Big().handle), Limits(keepalive=3600, head_timeout=3600)) as served:
        with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            with anyio.fail_after(30):  # the answer fills the socket; the task drains
                while not any(c._drain.waiting() for c in served.server.connections):  # noqa: ASYNC110
                    await anyio.sleep(0.01)

            def read_then_ask() -> tuple[int, bytes]:
                got = 0
                while got < len(body):  # the whole answer (its head is small)
                    got += len(sock.recv(1 << 20))
                rest = b""
                # The connection may already be closed as the request goes out: the kernel
                # then resets it, which is as unanswered as a clean end.
                with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    while chunk := sock.recv(1 << 20):
                        rest += chunk
                return got, rest

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(served.server.stop, 3600)
                with anyio.fail_after(30):  # told to stop before the client reads on
                    while not all(c.closing for c in served.server.connections):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                with anyio.fail_after(60):
                    got, rest = await anyio.to_thread.run_sync(read_then_ask)
    assert got >= len(body)
    assert b"HTTP/1.1" not in rest  # the request after the shutdown was not answered


async def test_a_closing_connection_whose_client_never_reads_is_aborted_after_its_timeout() -> None:
    """`Connection: close` and an answer the client never reads: the answer is written whole
    into the transport (under its high-water mark, or in one write), so nothing waits to
    drain, and the close waits for the client to read it. Without a timer on that close the
    connection, and its slot, were held for ever (a hostile tester filled the slots so)."""
    body = b"x" * (8 << 20)  # past what the two sockets buffer

    class Big:
        async def handle(self, request: Request, out: Responder) -> None:
            out.send_whole(200, [], body)

    limits = Limits(client_timeout=1, keepalive=3600, head_timeout=3600)
    async with _Server(Handling(Big().handle), limits) as served:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", served.port))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            with anyio.fail_after(30):
                while not any(c.closing for c in served.server.connections):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            for connection in list(served.server.connections):
                connection.shutdown()  # a stop's second close keeps the abort armed
            with anyio.fail_after(30):  # 1 s after the close, not never
                while served.server.connections:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
