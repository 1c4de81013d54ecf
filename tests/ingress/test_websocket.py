"""WebSockets and server-sent events through the ingress (`ingress.websocket`), against a real
WebSocket server (the `websockets` library's, as a sandbox process) and its real client: the
handshake is proxied, then frames go both ways with backpressure; the lease is held for the
connection's life (so it counts as traffic); either side's close ends it; the idle timeout and
the maximum duration close it; a refused handshake is passed on; other upgrades are answered
as plain requests; an event stream is passed on event by event."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.ingress import (
    RawServer,
    Stack,
    answering,
    read_head,
    sandbox_processes,
    stack,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
WS_APP = Path(__file__).with_name("ws_app.py")


@pytest.fixture
def ws_sandbox() -> Iterator[Callable[[], int]]:
    """Start WebSocket sandboxes (`ws_app.py`); returns each one's port."""
    yield from sandbox_processes(WS_APP)


def opened(s: Stack, path: str = "/chat") -> connect:
    """A client for the app `hello`: its URL names the app's host, its socket goes to the
    ingress on loopback."""
    host, port = s.ingress.address
    return connect(f"ws://hello.localhost:{port}{path}", host=host, port=port, compression=None)


async def open_on_sandbox(port: int) -> int:
    async with httpx.AsyncClient() as client:
        return int((await client.get(f"http://127.0.0.1:{port}/open")).text)


async def test_frames_cross_both_ways_and_the_handshake_headers_arrive(
    ws_sandbox: Callable[[], int],
) -> None:
    async with stack({"s1": ws_sandbox()}) as s, opened(s) as ws:
        for message in ["hello", b"\x00\x01binary", "x" * 100_000]:
            await ws.send(message)
            assert await ws.recv() == message
        await ws.send("headers")
        seen = json.loads(await ws.recv())
        assert seen["upgrade"].lower() == "websocket" and "sec-websocket-key" in seen
        assert seen["host"].startswith("hello.localhost") and seen["x-forwarded-for"] == "127.0.0.1"
        assert "x-request-id" in seen


async def test_a_flood_to_a_slow_reader_arrives_whole_in_bounded_memory(
    ws_sandbox: Callable[[], int],
) -> None:
    """Backpressure both hops: 64 MiB from the sandbox to a client that reads slowly arrive
    whole, and the ingress (in this process, with the client) never holds a large part."""
    total = 64 << 20
    async with stack({"s1": ws_sandbox()}) as s, opened(s) as ws:
        tracemalloc.start()
        try:
            await ws.send(f"flood {total}")
            got = 0
            while got < total:
                got += len(await ws.recv())
                if got % (4 << 20) < 65536:
                    await anyio.sleep(0.05)  # a slow reader: the sandbox must wait for it
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert got == total
    assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB"


async def test_the_lease_is_held_while_it_is_open_and_counted_as_in_flight(
    ws_sandbox: Callable[[], int],
) -> None:
    async with stack({"s1": ws_sandbox()}) as s:
        async with opened(s) as ws:
            await ws.send("ping")
            assert await ws.recv() == "ping"
            assert s.leased() == 1
            assert s.sample("websockets_open", app="hello") == 1
            assert s.sample("requests_in_flight", app="hello") == 1
        await eventually(lambda: s.sample("websockets_open", app="hello") == 0)
        assert s.sample("requests_in_flight", app="hello") == 0
        # The use went back: the cached lease has no request on it any more.
        assert all(entry.uses == 0 for entry in s.ingress.cache.snapshot())


async def test_a_client_close_reaches_the_sandbox(ws_sandbox: Callable[[], int]) -> None:
    port = ws_sandbox()
    async with stack({"s1": port}) as s:
        async with opened(s) as ws:
            await ws.send("ping")
            await ws.recv()
            assert await open_on_sandbox(port) == 1
        with anyio.fail_after(30):
            while await open_on_sandbox(port):  # noqa: ASYNC110 - another process's count
                await anyio.sleep(0.01)


async def test_a_sandbox_close_reaches_the_client(ws_sandbox: Callable[[], int]) -> None:
    async with stack({"s1": ws_sandbox()}) as s, opened(s) as ws:
        await ws.send("close")
        with pytest.raises(ConnectionClosed) as closed, anyio.fail_after(30):
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000


async def connection_ends(ws: ClientConnection) -> None:
    with anyio.fail_after(30):
        await ws.wait_closed()


async def test_an_idle_websocket_is_closed(ws_sandbox: Callable[[], int]) -> None:
    async with (
        stack({"s1": ws_sandbox()}, websocket_idle_timeouts={"hello": 0.3}) as s,
        opened(s) as ws,
    ):
        await ws.send("ping")
        assert await ws.recv() == "ping"
        await connection_ends(ws)  # nothing crossed for 0.3 s
        await eventually(lambda: s.sample("websockets_open", app="hello") == 0)


async def ping_forever(ws: ClientConnection) -> None:
    while True:
        await ws.send("ping")
        await ws.recv()


async def test_a_busy_websocket_is_closed_at_its_maximum_duration(
    ws_sandbox: Callable[[], int],
) -> None:
    async with (
        stack({"s1": ws_sandbox()}, websocket_max_durations={"hello": 0.5}) as s,
        opened(s) as ws,
    ):
        with pytest.raises(ConnectionClosed), anyio.fail_after(30):
            await ping_forever(ws)  # busy all along: only the maximum duration ends it


async def test_a_refused_handshake_is_passed_on(ws_sandbox: Callable[[], int]) -> None:
    async with stack({"s1": ws_sandbox()}) as s:
        with pytest.raises(InvalidStatus) as refused:
            async with opened(s, "/refuse"):
                pass
        assert refused.value.response.status_code == 403
        assert refused.value.response.body == b"no WebSocket for you\n"
        await eventually(
            lambda: s.leased() == 0 or all(entry.uses == 0 for entry in s.ingress.cache.snapshot())
        )


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


async def test_another_upgrade_is_answered_as_a_plain_request_and_the_connection_closes(
    hello: Callable[[], int],
) -> None:
    async with stack({"s1": hello()}) as s:
        port = s.ingress.address[1]
        request = (
            b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
        )
        answer = await anyio.to_thread.run_sync(raw_exchange, port, request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"connection: close" in head.lower()
    assert body.startswith(b"hello from")


async def test_server_sent_events_reach_the_client_one_by_one() -> None:
    """A long-lived text/event-stream answer is streamed, not buffered: each event reaches
    the client before the sandbox sends the next, and the request counts as in flight all
    along (so it is activity, like a WebSocket)."""
    sent_first, go_on = threading.Event(), threading.Event()

    def events(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        conn.sendall(b"transfer-encoding: chunked\r\n\r\n")
        for n in range(3):
            event = b"data: event %d\n\n" % n
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            sent_first.set()
            if not go_on.wait(30):
                return
            go_on.clear()
        conn.sendall(b"0\r\n\r\n")

    with RawServer(events) as sandbox:
        async with stack({"s1": sandbox.port}) as s:
            got: list[str] = []
            async with s.client.stream("GET", "/events") as answer:
                assert answer.headers["content-type"] == "text/event-stream"
                lines = answer.aiter_lines()
                while len(got) < 3:
                    line = await anext(lines)
                    if line.startswith("data: "):
                        got.append(line)
                        assert s.sample("requests_in_flight", app="hello") == 1
                        go_on.set()  # the sandbox sends the next only now
    assert got == ["data: event 0", "data: event 1", "data: event 2"]


async def test_an_answer_head_goes_out_before_a_body_that_comes_late() -> None:
    """The head is held only to go out with the first body bytes of the same read: a stream
    whose body starts later gets its head at once (the client sees the status, and can
    act on it, while the sandbox prepares the first event)."""
    go_on = threading.Event()

    def late_body(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        if go_on.wait(60):
            conn.sendall(b"5\r\nhello\r\n0\r\n\r\n")

    with RawServer(late_body) as sandbox:
        async with stack({"s1": sandbox.port}) as s:

            def head_then_body() -> tuple[bytes, bytes]:
                with socket.create_connection(("127.0.0.1", s.ingress.address[1])) as conn:
                    conn.sendall(b"GET /events HTTP/1.1\r\nHost: hello.localhost\r\n\r\n")
                    conn.settimeout(10)  # held back, the head would come only with the body
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += conn.recv(65536)
                    go_on.set()
                    conn.settimeout(60)
                    rest = head.partition(b"\r\n\r\n")[2]
                    while not rest.endswith(b"0\r\n\r\n"):
                        rest += conn.recv(65536)
                    return head, rest

            head, rest = await anyio.to_thread.run_sync(head_then_body)
    assert head.startswith(b"HTTP/1.1 200")
    assert rest == b"5\r\nhello\r\n0\r\n\r\n"


async def test_stopping_the_ingress_closes_open_websockets_at_once(
    ws_sandbox: Callable[[], int],
) -> None:
    """A WebSocket never ends by itself: a stopping ingress closes it at once rather than wait
    out its shutdown grace (60 s here) for it."""

    async def sees_the_close(ws: ClientConnection) -> None:
        with pytest.raises(ConnectionClosed), anyio.fail_after(20):
            await ws.recv()

    async with (
        anyio.create_task_group() as tasks,
        stack({"s1": ws_sandbox()}, shutdown_timeout=60) as s,
    ):
        ws = await opened(s)
        await ws.send("ping")
        assert await ws.recv() == "ping"
        tasks.start_soon(sees_the_close, ws)
        # leaving the block stops the ingress; the client sees its WebSocket close meanwhile


HANDSHAKE = (
    b"GET /chat HTTP/%s\r\nHost: hello.localhost\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param(
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno"
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nSet-Cookie: injected=1\r\n\r\nyes",
            id="a second answer in the same write",
        ),
        pytest.param(
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno"
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"\r\nframes",
            id="a 101 after the refusal in the same write",
        ),
    ],
)
async def test_a_refused_handshake_is_passed_on_alone(answers: bytes) -> None:
    """Found by a hostile tester: what a sandbox writes after its refusal is never taken for
    the answer (it once merged a second answer's headers into the first, and a 101 after a
    403 opened a tunnel to a closed connection)."""
    with RawServer(answering(answers)) as sandbox:
        async with stack({"s1": sandbox.port}) as s:
            answer = await anyio.to_thread.run_sync(
                raw_exchange, s.ingress.address[1], HANDSHAKE % b"1.1"
            )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 ")
    assert head.lower().count(b"content-length") == 1 and b"injected" not in head
    assert body == b"no"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 199 Hm\r\nContent-Length: 5\r\n\r\nEVIL!"
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno",
        b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n",
    ],
    ids=["a 1xx with a body", "a refusal coded gzip"],
)
async def test_a_handshake_answer_framed_as_no_answer_may_be_is_a_502(answer: bytes) -> None:
    """The answer-head rules hold for handshakes too (`rules.framing_refused`)."""
    with RawServer(answering(answer)) as sandbox:
        async with stack({"s1": sandbox.port}) as s:
            got = await anyio.to_thread.run_sync(
                raw_exchange, s.ingress.address[1], HANDSHAKE % b"1.1"
            )
    assert got.startswith(b"HTTP/1.1 502 ") and b"EVIL" not in got, got[:200]


@pytest.mark.parametrize(
    ("request_bytes", "statuses", "sandbox_saw"),
    [
        pytest.param(
            b"GET /a HTTP/1.1\r\nHost: hello.localhost\r\n\r\n"
            b"GET /h2c HTTP/1.1\r\nHost: hello.localhost\r\nConnection: Upgrade, HTTP2-Settings"
            b"\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
            [200, 200],
            1,
            id="an h2c upgrade pipelined behind a request: both answered as plain requests",
        ),
        pytest.param(HANDSHAKE % b"1.0", [200], 1, id="an HTTP/1.0 handshake is a plain request"),
        pytest.param(
            b"CONNECT /x HTTP/1.1\r\nHost: hello.localhost\r\n\r\n",
            [400],
            0,
            id="CONNECT is refused",
        ),
    ],
)
async def test_requests_that_are_not_websocket_handshakes(
    request_bytes: bytes, statuses: list[int], sandbox_saw: int
) -> None:
    served: list[bytes] = []

    def plain(conn: socket.socket) -> None:
        while head := read_head(conn):
            served.append(head)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    with RawServer(plain) as sandbox:
        async with stack({"s1": sandbox.port}) as s:
            answer = await anyio.to_thread.run_sync(
                raw_exchange, s.ingress.address[1], request_bytes
            )
    got = [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    assert got == statuses
    assert b" 101 " not in answer
    assert sandbox.connections == sandbox_saw
    assert not [head for head in served if b"upgrade" in head.lower()]  # sent as plain ones


async def test_a_client_gone_mid_splice_ends_its_request_cancelled(
    ws_sandbox: Callable[[], int], caplog: pytest.LogCaptureFixture
) -> None:
    """A WebSocket client that drops its connection mid-splice cancels its request, which
    ends cancelled, as any coroutine does. Compiled, an `await` in the splice's `finally` lost
    the cancellation and it returned None (mypyc/mypyc#1114): the handler failed with a
    TypeError ("answering a request failed"), and the exception, left as the one being
    handled, came out again in later requests. CI runs the suite compiled: there this fails
    without the fix."""
    async with stack({"s1": ws_sandbox()}) as s:
        ws = await opened(s)
        await ws.send("ping")
        assert await ws.recv() == "ping"
        ws.transport.abort()  # gone, mid-splice
        await eventually(lambda: s.sample("websockets_open", app="hello") == 0)
        answer = await s.client.get("/")  # the next request is answered as any other:
        assert answer.status_code == 426  # the app's own answer to a plain GET
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert failed == [], [r.getMessage() for r in failed]


async def test_an_open_websocket_is_not_one_of_its_clients_requests_under_way(
    ws_sandbox: Callable[[], int],
) -> None:
    """A switched connection holds no upstream slot (`ingress.clients`): a client with a
    share of one keeps two WebSockets open, and a request besides."""
    async with (
        stack({"s1": ws_sandbox()}, requests_per_client=1) as s,
        opened(s) as first,
        opened(s) as second,
    ):
        for ws in (first, second):
            await ws.send("hello")
            assert await ws.recv() == "hello"
        answer = await s.client.get("/", headers={"Accept": "application/json"})
        assert answer.status_code != 429, answer.text


async def test_a_101_without_an_upgrade_header_is_a_502_that_says_so() -> None:
    """RFC 9110 §15.2.2: a 101 names the protocol it switches to. llhttp pauses on one without
    it all the same, and the 502 said what httptools says ("Pause on CONNECT/Upgrade"). Run
    after an exchange closed unanswered (compiled), it said that exchange's "the connection
    closed before any answer": the parse error's context was taken for a callback's error
    (`upstream.rules.callback_error`)."""
    answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n"

    def switch_and_stay(conn: socket.socket) -> None:  # open until the ingress drops it: the
        read_head(conn)  # 502 is for the 101 it read, never for a connection that ended
        conn.sendall(answer)
        with contextlib.suppress(OSError):
            while conn.recv(65536):
                pass

    with RawServer(switch_and_stay) as sandbox:
        async with stack({"s1": sandbox.port}) as s:
            got = await anyio.to_thread.run_sync(
                raw_exchange, s.ingress.address[1], HANDSHAKE % b"1.1"
            )
    assert got.startswith(b"HTTP/1.1 502 "), got
    assert got.endswith(b"the sandbox answered 101 with no Upgrade header\n"), got
