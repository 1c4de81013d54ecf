"""Retries, upstream failures and timeouts through the real stack (invariant 11)."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.abc
import httpx
import pytest

from tests.support.ingress import (
    RawServer,
    Stack,
    answering,
    closed_port,
    held,
    read_head,
    reset_after_reading,
    sandbox,
    stack,
)
from tests.support.waiting import eventually
from wakeful.domain.models import App, Pool, SandboxStatus
from wakeful.ingress.retry import RESEND_PAUSE
from wakeful.ingress.upstream import RawTransport

pytestmark = pytest.mark.anyio


async def test_connection_refused_is_retried_on_another_sandbox(
    hello: Callable[[], int],
) -> None:
    async with stack({"sb-a": closed_port(), "sb-b": hello()}) as s:
        answer = await s.client.get("/")
        assert answer.status_code == 200, answer.text
        assert answer.text.startswith("hello from")
        assert s.sample("connect_retries_total", app="hello") == 1
        assert s.sample("upstream_errors_total", app="hello", kind="connect") == 1
        # the refusing sandbox's leases left the cache and went back to the activator
        assert {e.grant.sandbox_id for e in s.ingress.cache.snapshot()} == {"sb-b"}
        assert s.activator.leased_on("sb-a") == 0


async def test_retries_stop_after_the_bound() -> None:
    async with stack({"sb-a": closed_port(), "sb-b": closed_port()}, connect_retries=2) as s:
        answer = await s.client.get("/", headers={"Accept": "application/json"})
        assert answer.status_code == 502
        assert answer.json()["error"] == "upstream failed"
        assert s.sample("connect_retries_total", app="hello") == 2
        assert s.leased() == 0
        assert s.sample("requests_in_flight", app="hello") == 0


async def test_a_reset_before_any_answer_is_retried_once_only_when_it_can_be_replayed(
    hello: Callable[[], int],
) -> None:
    """Invariant 11: an idempotent request without a body whose connection is reset before
    any byte of the answer is sent once more, on a fresh connection to the same sandbox; a
    POST (or anything with a body) never is, and neither goes to another sandbox."""
    with RawServer(reset_after_reading) as broken:
        async with stack({"sb-a": broken.port, "sb-b": hello()}) as s:
            answer = await s.client.get("/")
            assert answer.status_code == 502, answer.text
            assert broken.connections == 2  # the first try and one retry, both to sb-a
            answer = await s.client.post("/", content=b"once")
            assert answer.status_code == 502, answer.text
            assert broken.connections == 3  # the POST went out once
            assert s.sample("connect_retries_total", app="hello") == 0
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 2
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())


class Swamped:
    """A sandbox out of threads for `WINDOW` seconds from the first connection it took: it
    shuts each connection it takes meanwhile once it read the request (as a thread-per-
    connection app does when it cannot start one), then answers."""

    WINDOW = RESEND_PAUSE * 0.8

    def __init__(self) -> None:
        self.first: float | None = None
        self.shut = 0

    def __call__(self, conn: socket.socket) -> None:
        now = time.monotonic()
        self.first = self.first or now
        read_head(conn)
        if now - self.first < self.WINDOW:
            self.shut += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_a_new_connection_shut_unanswered_is_sent_again_after_a_pause() -> None:
    """A burst on a cold app can reach a sandbox that has no thread left: it shuts the new
    connection. Not the keep-alive race (the connection carried nothing before), so the one
    resend waits `RESEND_PAUSE`, and finds the sandbox caught up, where at once it would
    have been shut too (a 502)."""
    swamped = Swamped()
    with RawServer(swamped) as server:
        async with stack({"sb-a": server.port}) as s:
            answer = await s.client.get("/")
            assert answer.status_code == 200, answer.text
            assert (swamped.shut, server.connections) == (1, 2)
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 0


class OneThread:
    """A sandbox with one thread: the first connection it takes is its own and served (each
    answer held until a second connection has come), any other it shuts once it read the
    request."""

    def __init__(self) -> None:
        self.connections = 0
        self.shut = 0
        self.other_came = anyio.Event()

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with stream:
            first = self.connections == 1
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    try:
                        data += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                data = data.split(b"\r\n\r\n", 1)[1]
                if not first:
                    self.shut += 1
                    self.other_came.set()
                    return
                await self.other_came.wait()
                await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_the_resend_after_a_new_connection_was_shut_takes_an_idle_pooled_one() -> None:
    """The threads an app is out of are often held by our own pooled connections: the resend
    after the pause takes the one the pool has idle by then (its thread is there), not yet
    another new one the app would shut too."""
    one = OneThread()
    async with (
        await anyio.create_tcp_listener(local_host="127.0.0.1") as listener,
        anyio.create_task_group() as serving,
    ):
        serving.start_soon(listener.serve, one.handle)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with stack({"sb-a": port}) as s:
            async with anyio.create_task_group() as both:
                answers = []

                async def ask() -> None:
                    answers.append(await s.client.get("/"))

                both.start_soon(ask)
                both.start_soon(ask)
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            assert (one.shut, one.connections) == (1, 2)
        serving.cancel_scope.cancel()


def _answer_then_close(conn: socket.socket) -> None:
    """Answer one request as if keeping the connection alive, then read the next and close
    without a word: the race a pooled connection loses when the sandbox's idle timeout fires
    as a request goes out."""
    read_head(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    read_head(conn)


async def test_a_pooled_connection_the_sandbox_closed_is_not_a_502() -> None:
    with RawServer(_answer_then_close) as server:
        async with stack({"sb-a": server.port}) as s:
            for _ in range(3):
                answer = await s.client.get("/")
                assert answer.status_code == 200, answer.text
                assert answer.text == "ok"
            assert server.connections == 3
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 0


async def test_a_silent_sandbox_times_out_with_504(hello: Callable[[], int]) -> None:
    async with stack({"sb-1": hello()}, request_timeout=0.3) as s:
        answer = await s.client.get("/sleep?s=2")
        assert answer.status_code == 504
        assert "upstream timed out" in answer.text
        assert s.sample("upstream_errors_total", app="hello", kind="timeout") == 1
        assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
    async with stack({"sb-1": hello()}, request_timeouts={"hello": 5.0}, request_timeout=0.3) as s:
        assert (await s.client.get("/sleep?s=0.6")).status_code == 200  # per-app override


def _half_answer_then_silent(conn: socket.socket) -> None:
    """Sends the head and part of the body, then nothing until the ingress hangs up."""
    read_head(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf-")
    while conn.recv(65536):
        pass


async def test_a_sandbox_silent_mid_answer_is_cut_off_and_counted() -> None:
    """Silence counts from the sandbox's last byte once its head is in: the client gets what
    came and then the end of its connection, never a hang."""
    with RawServer(_half_answer_then_silent) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}, request_timeout=0.3) as s:
            port = s.ingress.address[1]

            def ask() -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
                    conn.sendall(b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n")
                    got = b""
                    while chunk := conn.recv(65536):
                        got += chunk
                    return got

            answer = await anyio.to_thread.run_sync(ask)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"half-")
            assert s.sample("upstream_errors_total", app="hello", kind="timeout") == 1
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())


def _late_head_then_late_body(conn: socket.socket) -> None:
    """Each part comes after a pause shorter than the request timeout (2 s), the two longer."""
    read_head(conn)
    time.sleep(1.2)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
    time.sleep(1.2)
    conn.sendall(b"body")


async def test_silence_counts_from_the_head_once_it_came() -> None:
    """The head ends one silence and starts the next: an answer whose every pause is shorter
    than the timeout completes, however long it takes in all."""
    with RawServer(_late_head_then_late_body) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}, request_timeout=2.0) as s:
            answer = await s.client.get("/")
            assert (answer.status_code, answer.text) == (200, "body")
            assert s.sample("upstream_errors_total", app="hello", kind="timeout") == 0


def _head_then_a_late_body(conn: socket.socket) -> None:
    """Answers HEAD with a Content-Length and, a second later, sends bytes shaped as an
    answer anyway; answers GET with "ok"."""
    if read_head(conn).startswith(b"HEAD"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 52\r\n\r\n")
        time.sleep(1.0)
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nINJECTED-BODY")
        return
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_bytes_a_sandbox_sends_after_a_head_answer_never_reach_another_request() -> None:
    """A HEAD answer's connection is not reused: what the sandbox writes after it cannot be
    taken as the answer to the next request (found by a hostile tester)."""
    with RawServer(_head_then_a_late_body) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}) as s:
            assert (await s.client.head("/")).status_code == 200
            answer = await s.client.get("/victim")
            assert (answer.status_code, answer.text) == (200, "ok")


def _keep_alive_then_watch(closed: list[float]) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        while conn.recv(65536):
            pass
        closed.append(1.0)

    return handle


async def test_an_idle_pooled_connection_is_closed_after_the_upstream_keepalive() -> None:
    closed: list[float] = []
    with RawServer(_keep_alive_then_watch(closed)) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}, upstream_keepalive=0.2) as s:
            assert (await s.client.get("/")).status_code == 200
            await eventually(lambda: closed == [1.0])


def _canned(conn: socket.socket) -> None:
    read_head(conn)
    body = b"canned"
    conn.sendall(
        b"HTTP/1.1 200 OK\r\n"
        b"Connection: close, X-Hop\r\n"
        b"X-Hop: secret\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"Proxy-Authenticate: Basic\r\n"
        b"Upgrade: h2c\r\n"
        b"X-Request-Id: from-the-sandbox\r\n"
        b"Set-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def test_hop_by_hop_response_headers_are_stripped() -> None:
    with RawServer(_canned) as canned:
        async with stack({"sb-1": canned.port}) as s:
            answer = await s.client.get("/", headers={"X-Request-Id": "req-42"})
            assert answer.text == "canned"
            for name in ("x-hop", "keep-alive", "proxy-authenticate", "upgrade"):
                assert name not in answer.headers
            assert answer.headers.get_list("set-cookie") == ["a=1", "b=2"]
            assert answer.headers["x-request-id"] == "req-42"


@contextlib.asynccontextmanager
async def _two_apps(
    hello: Callable[[], int], wait: float
) -> AsyncIterator[tuple[Stack, RawTransport]]:
    """`hello` and `other`, one sandbox each, two upstream connections per app at most."""
    other = App(name="other", hosts=[], active_version="v1")
    async with stack(
        {"sb-1": hello()},
        rpi=100,
        extra_apps=[other],
        upstream_connections_per_app=2,
        upstream_wait=wait,
    ) as s:
        pool = await s.store.get("pools/hello-v1", Pool)
        assert pool is not None
        await s.store.put(
            "pools/other-v1",
            pool.value.model_copy(update={"name": "other-v1", "app": "other"}),
        )
        record = sandbox("sb-o", hello(), SandboxStatus.RUNNING)
        other_record = record.model_copy(update={"pool": "other-v1", "app": "other"})
        await s.store.put("sandboxes/sb-o", other_record)
        transport = s.ingress.transport
        assert isinstance(transport, RawTransport)
        yield s, transport


async def _until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 -- no event to wait on
            await anyio.sleep(0.01)


async def test_one_app_cannot_take_every_upstream_connection(
    hello: Callable[[], int],
) -> None:
    """Past its share of upstream connections an app's requests get 503 + Retry-After (after
    `upstream_wait`, 0 here) while another app's requests go through."""
    async with _two_apps(hello, wait=0) as (s, transport):
        release = anyio.Event()
        statuses: list[int] = []

        async def hold() -> None:
            statuses.append(await held(s.client, release))

        async with anyio.create_task_group() as tasks:
            for _ in range(2):
                tasks.start_soon(hold)
            await _until(lambda: transport.slots.busy.get("hello", 0) == 2)
            busy = await s.client.get("/", headers={"Accept": "application/json"})
            assert busy.status_code == 503, busy.text
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"] == "upstream busy"
            elsewhere = await s.client.get("/", headers={"Host": "other.localhost"})
            assert elsewhere.status_code == 200, elsewhere.text
            release.set()
        assert statuses == [200, 200]
        assert (await s.client.get("/")).status_code == 200  # the slots came back
        assert transport.slots.in_use == 0


async def test_a_request_waiting_for_its_apps_share_does_not_hold_up_another_app(
    hello: Callable[[], int],
) -> None:
    """hello is at its share with a third request queued for a slot (a long wait): other's
    request goes straight through, and the queued one gets the first slot hello frees."""
    async with _two_apps(hello, wait=300) as (s, transport):
        release = anyio.Event()
        statuses: list[int] = []

        async def hold() -> None:
            statuses.append(await held(s.client, release))

        async def queued() -> None:
            statuses.append((await s.client.get("/")).status_code)

        async with anyio.create_task_group() as tasks:
            for _ in range(2):
                tasks.start_soon(hold)
            await _until(lambda: transport.slots.busy.get("hello", 0) == 2)
            tasks.start_soon(queued)
            await _until(lambda: bool(transport.slots.waiters))
            elsewhere = await s.client.get("/", headers={"Host": "other.localhost"})
            assert elsewhere.status_code == 200, elsewhere.text
            assert statuses == []  # hello's three are all still in flight or queued
            release.set()
        assert sorted(statuses) == [200, 200, 200]
        assert transport.slots.in_use == 0 and not transport.slots.waiters


async def test_a_client_trickling_a_small_body_holds_no_upstream_connection_and_no_lease(
    hello: Callable[[], int],
) -> None:
    """A small body is read whole before the request takes capacity (`preread`): a
    client that sends it slowly (or never finishes it) holds neither the app's one upstream
    connection here nor a lease, so the app's other requests go through meanwhile."""
    async with stack({"s1": hello()}, upstream_connections_per_app=1, upstream_wait=0) as s:
        host, port = s.ingress.address
        async with await anyio.connect_tcp(host, port) as stalled:
            await stalled.send(
                b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nContent-Length: 10\r\n\r\nabc"
            )
            for _ in range(3):
                answer = await s.client.get("/")
                assert answer.status_code == 200, answer.text
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(entry.uses == 0 for entry in s.ingress.cache.snapshot())
            await stalled.send(b"defghij")  # the rest: now it is forwarded and answered
            with anyio.fail_after(30):
                reply = await stalled.receive()
            assert reply.startswith(b"HTTP/1.1 200 ")


def _answer_early_then_never_read(seen: list[str]) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        poller = select.poll()  # what happens to the connection; its body is never read
        poller.register(conn, select.POLLERR | select.POLLHUP | select.POLLRDHUP)
        events = poller.poll(15_000)
        seen.append("ended" if events else "held")

    return handle


async def test_a_sandbox_that_answers_early_and_never_reads_holds_nothing() -> None:
    """A POST answered before its body was read, by a sandbox that then neither reads nor
    closes: the exchange is over, and the connection to the sandbox is dropped with what of
    the body it never read. A graceful close waited for the sandbox to read it, for ever: one
    descriptor and up to a megabyte pinned a request, by the owner of any app (a hostile
    tester's find)."""
    seen: list[str] = []
    body = b"a" * (8 << 20)
    with RawServer(_answer_early_then_never_read(seen)) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}) as s:

            def post() -> bytes:
                with socket.create_connection(("127.0.0.1", s.ingress.address[1])) as sock:
                    head = b"POST / HTTP/1.1\r\nHost: hello.localhost\r\n"
                    sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
                    with contextlib.suppress(OSError):  # the ingress stops taking it
                        sock.settimeout(5)
                        sock.sendall(body)
                    return sock.recv(100)

            with anyio.fail_after(60):
                answer = await anyio.to_thread.run_sync(post)
                assert answer.startswith(b"HTTP/1.1 200"), answer
                while not seen:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
    assert seen == ["ended"]


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 199 Hm\r\nContent-Length: 5\r\n\r\nEVIL!"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\nok",
    ],
    ids=["a 1xx with a body", "gzip, chunked", "gzip alone"],
)
async def test_framing_an_answer_cannot_have_is_a_502(answer: bytes) -> None:
    """A 1xx has no body: llhttp read one after a `199` with a Content-Length, and it went
    out as the answer's body. A transfer coding but chunked went out undone and unnamed
    (gzip bytes the client could not tell from the body). Both are the sandbox's failure,
    as nginx has it (a hostile tester's find)."""
    with RawServer(answering(answer)) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}) as s:
            got = await s.client.get("/")
            assert got.status_code == 502, got.text
            assert b"EVIL" not in got.content


@pytest.mark.parametrize("http2", [False, True], ids=["HTTP/1.1", "HTTP/2"])
async def test_an_answer_that_breaks_before_any_of_it_went_is_a_502(http2: bool) -> None:
    """The head is held until the body's first bytes: when the body breaks in the same read
    as the head, nothing has gone to the client, and it gets a 502 rather than an empty reply
    (a hostile tester's find)."""
    broken = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ-not-a-size\r\n"
    with RawServer(answering(broken)) as sandbox_server:
        async with stack({"sb-1": sandbox_server.port}) as s:
            async with httpx.AsyncClient(
                base_url=s.url, http1=not http2, http2=http2, timeout=30
            ) as client:
                got = await client.get("/", headers={"host": "hello.localhost"})
            assert got.status_code == 502, got.text
            assert got.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 1
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())


@pytest.mark.parametrize("http2", [False, True], ids=["HTTP/1.1", "HTTP/2"])
async def test_an_answer_head_goes_on_as_each_client_may_take_it(http2: bool) -> None:
    """llhttp keeps a value's trailing whitespace (`Content-Length: 3 ` is valid HTTP/1.1),
    and a 204 may come with a Content-Length: both went on to HTTP/2 clients as sent, where
    they are malformed (RFC 9113 §8.2.1, RFC 9110 §8.6), and nghttp2 and curl reset the stream,
    h2 (httpx) the whole connection (a hostile tester's find)."""

    def handle(conn: socket.socket) -> None:
        head = read_head(conn)
        if head.startswith(b"GET /empty "):
            conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\nX-Pad: a\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3 \r\nX-Pad: evil \t \r\n\r\nabc")

    with RawServer(handle) as sandbox_server:
        async with (
            stack({"sb-1": sandbox_server.port}) as s,
            httpx.AsyncClient(base_url=s.url, http1=not http2, http2=http2, timeout=30) as client,
        ):
            padded = await client.get("/", headers={"host": "hello.localhost"})
            empty = await client.get("/empty", headers={"host": "hello.localhost"})
    assert (padded.status_code, padded.content) == (200, b"abc")
    assert padded.headers["x-pad"] == "evil" and padded.headers["content-length"] == "3"
    assert empty.status_code == 204 and "content-length" not in empty.headers
