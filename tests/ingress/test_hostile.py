"""What a hostile sandbox or client tried against the HTTP/1.1 server and the upstream
transport, each a case that broke before its fix."""

from __future__ import annotations

import contextlib
import socket
import time
import tracemalloc
from collections.abc import Callable

import anyio
import pytest

from tests.support.ingress import RawServer, keep_alive, read_head, responses, stack, talk
from tests.support.waiting import eventually
from wakeful.ingress.http1 import PIPELINE_MAX
from wakeful.ingress.upstream import RawTransport

pytestmark = pytest.mark.anyio

FORGED = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nSet-Cookie: stolen=1\r\n\r\nforged"


def _two_answers(conn: socket.socket) -> None:
    """Answers every request with its answer and a second, unasked one in the same write."""
    while read_head(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + FORGED)


async def test_a_sandbox_cannot_slip_a_second_answer_onto_a_client_connection() -> None:
    with RawServer(_two_answers) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            asks = b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n" * 2
            asks += b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nConnection: close\r\n\r\n"
            answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], asks)
    assert responses(answer) == [(200, b"ok")] * 3, answer
    assert b"stolen" not in answer and answer.lower().count(b"content-length") == 3


def _endless(first: bytes, line: bytes) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        read_head(conn)
        try:
            conn.sendall(first)
            for _ in range(1 << 16):
                conn.sendall(line * 1024)
        except OSError:
            pass  # the ingress hung up: what it should do

    return handle


@pytest.mark.parametrize(
    ("first", "line"),
    [
        (b"HTTP/1.1 200 OK\r\n", b"X-Flood: aaaaaaaaaaaaaaaaaaaaaaaa\r\n"),
        (b"HTTP/1.1 200 OK\r\nX-Long: ", b"a" * 64),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n", b"X-Trailer: aaaa\r\n"),
    ],
    ids=["endless headers", "one endless header", "endless trailers"],
)
async def test_an_endless_answer_head_is_refused_within_a_bound(first: bytes, line: bytes) -> None:
    with RawServer(_endless(first, line)) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            tracemalloc.start()
            try:
                answer = await anyio.to_thread.run_sync(
                    talk,
                    s.ingress.address[1],
                    b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nConnection: close\r\n\r\n",
                )
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    # 502 before the answer started; once it started (trailers), the answer is cut short.
    assert answer.startswith(b"HTTP/1.1 502") or not answer.endswith(b"0\r\n\r\n"), answer
    assert peak < 16 * 1024 * 1024


def _status(code: bytes) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        while read_head(conn):
            conn.sendall(b"HTTP/1.1 " + code + b" X\r\nContent-Length: 2\r\n\r\nok")

    return handle


async def test_an_answer_with_a_status_outside_200_599_is_a_502() -> None:
    with RawServer(_status(b"000")) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            answer = await s.client.get("/")
    assert answer.status_code == 502, answer.text


async def test_an_error_answer_has_one_content_length() -> None:
    async with stack() as s:
        answer = await anyio.to_thread.run_sync(
            talk,
            s.ingress.address[1],
            b"GET / HTTP/1.1\r\nHost: nope.localhost\r\nConnection: close\r\n\r\n",
        )
    assert answer.startswith(b"HTTP/1.1 404")
    assert answer.lower().count(b"content-length") == 1


def _flood(conn: socket.socket) -> None:
    read_head(conn)
    size = 1 << 30
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(size // len(chunk)):
            conn.sendall(chunk)
    except OSError:
        pass


def _served(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: nope.localhost\r\nConnection: close\r\n\r\n")
        return sock.recv(20).startswith(b"HTTP/1.1 404")


async def test_a_client_cut_off_for_not_reading_leaves_its_connection_slot() -> None:
    with RawServer(_flood) as sandbox:
        async with stack({"sb-1": sandbox.port}, client_timeout=0.3, max_client_connections=1) as s:
            port = s.ingress.address[1]
            with socket.create_connection(("127.0.0.1", port), timeout=30) as stuck:
                stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                stuck.sendall(b"GET /big HTTP/1.1\r\nHost: hello.localhost\r\n\r\n")
                # Never read: once cut off, the connection is gone and a new client is served.
                with anyio.fail_after(60):
                    while not await anyio.to_thread.run_sync(_served, port):  # noqa: ASYNC110
                        await anyio.sleep(0.1)


def _silent(conn: socket.socket) -> None:
    """Reads the request and answers nothing until the ingress hangs up."""
    read_head(conn)
    while conn.recv(65536):
        pass


async def test_a_client_that_closes_its_side_ends_its_exchange_at_once() -> None:
    with RawServer(_silent) as sandbox:
        async with stack({"sb-1": sandbox.port}, request_timeout=3600) as s:
            transport = s.ingress.transport
            assert isinstance(transport, RawTransport)
            with socket.create_connection(("127.0.0.1", s.ingress.address[1])) as client:
                client.sendall(b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n")
                await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1)
                client.shutdown(socket.SHUT_WR)  # a plain FIN, as `curl -m 1` leaves
                await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0)
            assert transport.slots.in_use == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())


async def test_a_pipelined_flood_in_one_write_is_refused_not_queued() -> None:
    """2,000 requests in one write: those parsed before the queue's bound are answered in
    order, the one past it gets a 400, nothing after it is read, and no answer is lost to a
    reset (the rest is read away before the close)."""
    async with stack() as s:
        flood = b"GET / HTTP/1.1\r\nHost: nope.localhost\r\n\r\n" * 2000
        answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], flood)
    statuses = [status for status, _ in responses(answer)]
    assert statuses[-1] == 400 and set(statuses[:-1]) == {404}, statuses[-3:]
    assert PIPELINE_MAX <= len(statuses) - 1 < 2000
    assert answer.count(b"connection: close") == 1  # only the last answer ends it


async def test_a_malformed_request_behind_a_good_one_is_refused_after_its_answer() -> None:
    async with stack() as s:
        asks = (
            b"GET / HTTP/1.1\r\nHost: nope.localhost\r\n\r\n"
            b"GET / HTTP/1.1\r\nHost: nope.localhost\r\nX: a\r\n folded\r\n\r\n"
            b"GET / HTTP/1.1\r\nHost: nope.localhost\r\n\r\n"
        )
        answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], asks)
    assert [status for status, _ in responses(answer)] == [404, 400]


async def test_a_chunked_body_the_app_ignores_does_not_poison_the_next_request(
    hello: Callable[[], int],
) -> None:
    """The sample app reads only Content-Length bodies: the connection a chunked body went
    out on is not reused, so the next request gets its own answer."""
    async with stack({"sb-1": hello()}) as s:
        asks = (
            b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n"
            b"GET /bytes?n=3 HTTP/1.1\r\nHost: hello.localhost\r\nConnection: close\r\n\r\n"
        )
        answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], asks)
    statuses = [status for status, _ in responses(answer)]
    assert statuses[-1] == 200 and responses(answer)[-1][1] == b"www", answer


def _record(heads: list[bytes]) -> Callable[[socket.socket], None]:
    """Answers once, then reads to the end: closing with the body unread would reset the
    connection, and the reset could take the answer with it."""

    def handle(conn: socket.socket) -> None:
        heads.append(read_head(conn))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        conn.settimeout(10)
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass

    return handle


async def test_request_trailers_never_reach_the_sandbox_as_headers() -> None:
    """httptools reports a chunked body's trailer fields as headers: they went into the
    request's headers after the edge had checked and routed them, a second Host among them
    (a hostile tester's find). Trailers are dropped."""
    heads: list[bytes] = []
    with RawServer(_record(heads)) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            ask = (
                b"POST /upload HTTP/1.1\r\nHost: hello.localhost\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n5\r\nhello\r\n"
                b"0\r\nHost: admin.internal\r\nX-Api-Key: injected\r\n\r\n"
            )
            answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], ask)
    assert responses(answer) == [(200, b"ok")], answer
    assert len(heads) == 1 and b"admin.internal" not in heads[0], heads
    assert b"x-api-key" not in heads[0].lower(), heads


async def test_endless_trailers_are_refused_within_the_head_bound() -> None:
    """A chunked body's trailer section (or its chunk framing) was counted against nothing:
    a client could grow the ingress by megabytes a second for `client_timeout` (a hostile
    tester's find). Reads in a row that bring no body bytes are bounded as a head is."""
    heads: list[bytes] = []
    with RawServer(_record(heads)) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            port = s.ingress.address[1]

            def flood() -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                    sock.sendall(
                        b"POST / HTTP/1.1\r\nHost: hello.localhost\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
                    )
                    time.sleep(0.3)  # the edge has the head and waits for the body
                    sock.sendall(b"0\r\n")
                    with contextlib.suppress(OSError):  # it stops reading past the bound
                        sock.sendall((b"x-trailer-field: " + b"v" * 40 + b"\r\n") * 20_000)
                    return sock.recv(65536)

            with anyio.fail_after(30):
                answer = await anyio.to_thread.run_sync(flood)
            assert s.sample("connections_refused_total", reason="framing") == 1
    assert answer.startswith(b"HTTP/1.1 400 "), answer


async def test_an_absolute_form_target_is_served_for_the_host_it_names() -> None:
    """RFC 9112 §3.2.2: a server accepts `GET http://host/path` (what a client configured
    with the ingress as its proxy sends) and takes the host from it, not from Host. It was a
    400 (a hostile tester's find)."""
    heads: list[bytes] = []
    with RawServer(_record(heads)) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            ask = (
                b"GET http://hello.localhost/x?y=1 HTTP/1.1\r\nHost: other.example\r\n"
                b"Connection: close\r\n\r\n"
            )
            answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], ask)
    assert responses(answer) == [(200, b"ok")], answer
    assert heads[0].startswith(b"GET /x?y=1 HTTP/1.1\r\nhost: hello.localhost\r\n"), heads
    assert b"other.example" not in heads[0], heads


@pytest.mark.parametrize("pipelined", [20, 0], ids=["behind 20 pipelined GETs", "head alone"])
async def test_a_body_after_a_large_read_is_not_taken_for_framing(pipelined: int) -> None:
    """The framing bound counts reads after the one that ended the head: a read holding 20
    pipelined requests with 2 KB headers, or a head near the bound, then a chunk's size line
    alone and its data a moment later, is served (a reviewer's find: the first version
    counted the head's read and answered 400)."""
    heads: list[bytes] = []
    big = b"x-big: " + b"b" * 2000 + b"\r\n"
    gets = b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n" + big + b"\r\n"
    post = b"POST /up HTTP/1.1\r\nHost: hello.localhost\r\nTransfer-Encoding: chunked\r\n"
    post += b"Connection: close\r\n"
    if pipelined:
        post += big + b"\r\n"
    else:  # 32,760 bytes: within the bound (32 KiB), and within it with the first framing
        post += b"x-big: " + b"b" * (32_760 - len(post) - 11) + b"\r\n\r\n"
    with RawServer(keep_alive(heads)) as sandbox:
        async with stack({"sb-1": sandbox.port}) as s:
            port = s.ingress.address[1]

            def ask() -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                    sock.sendall(gets * pipelined + post)
                    time.sleep(0.3)
                    sock.sendall(b"5;e=abcdefghijkl\r\n")  # a read of framing alone
                    time.sleep(0.1)
                    sock.sendall(b"hello\r\n0\r\n\r\n")
                    got = b""
                    while chunk := sock.recv(65536):
                        got += chunk
                    return got

            answer = await anyio.to_thread.run_sync(ask)
    assert [status for status, _ in responses(answer)] == [200] * (pipelined + 1), answer[-300:]


@pytest.mark.parametrize(
    "host",
    [b"\xb5.example.com", b"a." * 16_300 + b"b", b"evil.com#.example.com"],
    ids=["latin-1 micro", "16,300 labels", "a fragment"],
)
async def test_a_host_that_is_no_host_is_a_400(host: bytes) -> None:
    """RFC 9112 §3.2: a Host that is not one is a 400. A latin-1 µ case-folded to Greek mu
    and crashed the HTTPS redirect's Location; 16,300 labels cost the wildcard lookup 100 ms
    of the loop every request shares; a `#` led the redirect elsewhere (a hostile tester's
    finds)."""
    async with stack({"sb-1": 1}, hosts=["*.example.com"]) as s:
        ask = b"GET / HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n"
        with anyio.fail_after(10):
            answer = await anyio.to_thread.run_sync(talk, s.ingress.address[1], ask)
    assert [status for status, _ in responses(answer)] == [400], answer[:200]
