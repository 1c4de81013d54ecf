"""Routing, header rules, error formats and the bounded wait, over real HTTP."""

from __future__ import annotations

import contextlib
import gc
import itertools
import socket
import time
import tracemalloc
from collections.abc import Callable

import anyio
import httpx
import pytest
from pydantic import ValidationError

from tests.support.ingress import RawServer, Stack, read_head, stack
from tests.support.waiting import eventually
from wakeful.domain.models import App
from wakeful.ingress.settings import IngressSettings, listens_on_loopback

pytestmark = pytest.mark.anyio


async def test_hosts_route_exact_then_wildcard_then_app_dot_domain(
    hello: Callable[[], int],
) -> None:
    hosts = ["www.example.com", "*.apps.example.org"]
    async with stack({"sb-1": hello()}, hosts=hosts, base_domain="test.internal") as s:
        for host in ("WWW.Example.COM:8080", "a.b.apps.example.org", "hello.test.internal:1"):
            answer = await s.client.get("/", headers={"Host": host})
            assert answer.status_code == 200, (host, answer.text)
        missing = await s.client.get("/", headers={"Host": "nope.test.internal"})
        assert missing.status_code == 404
        assert "nope.test.internal" in missing.text
        assert "unknown host" in missing.text
        # the table follows the store
        await s.store.put(
            "apps/hello", App(name="hello", hosts=["late.example.com"], active_version="v1")
        )
        await eventually(lambda: "late.example.com" in s.ingress.routes.index.exact)
        assert (await s.client.get("/", headers={"Host": "late.example.com"})).status_code == 200
        gone = await s.client.get("/", headers={"Host": "www.example.com"})
        assert gone.status_code == 404


async def test_an_app_without_a_pool_is_404_and_unrouted_hosts_never_reach_a_sandbox() -> None:
    async with stack(extra_apps=[App(name="other")]) as s:
        answer = await s.client.get("/", headers={"Host": "other.localhost"})
        assert answer.status_code == 404
        assert "unknown app" in answer.text
        assert s.sample("requests_total", app="other", status_class="4xx") == 1
        # control-plane hosts are not apps: nothing to forward to
        assert (await s.client.get("/", headers={"Host": "127.0.0.1"})).status_code == 404
        assert s.sample("requests_total", app="-", status_class="4xx") == 1


def _seen(text: str) -> dict[str, str]:
    return {k.lower(): v for k, _, v in (line.partition(": ") for line in text.splitlines())}


async def test_request_headers_are_rewritten(hello: Callable[[], int]) -> None:
    sent = {
        "Connection": "keep-alive, X-Drop",
        "X-Drop": "1",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Proxy-Authorization": "Basic eA==",
        "X-Forwarded-For": "203.0.113.9",
        "X-Forwarded-Proto": "https",
        "X-Custom": "kept",
    }
    async with stack({"sb-1": hello()}) as s:
        answer = await s.client.get("/headers", headers=sent)
        seen = _seen(answer.text)
        for name in ("x-drop", "keep-alive", "te", "proxy-authorization", "trailer"):
            assert name not in seen
        assert seen["x-custom"] == "kept"
        assert seen["x-forwarded-for"] == "127.0.0.1"  # the client's claim is not trusted
        assert seen["x-forwarded-proto"] == "http"
        assert seen["x-forwarded-host"] == "hello.localhost"
        assert seen["host"] == "hello.localhost"
        assert seen["x-request-id"] == answer.headers["x-request-id"]
        assert len(answer.headers["x-request-id"]) == 32
        again = await s.client.get("/headers", headers={"X-Request-Id": "abc-123"})
        assert _seen(again.text)["x-request-id"] == "abc-123"
        assert again.headers["x-request-id"] == "abc-123"
    async with stack({"sb-1": hello()}, trust_forwarded=True) as s:
        seen = _seen((await s.client.get("/headers", headers=sent)).text)
        assert seen["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
        assert seen["x-forwarded-proto"] == "https"


async def test_oversized_headers_get_431() -> None:
    async with stack(max_header_bytes=4096) as s:
        answer = await s.client.get("/", headers={"X-Big": "x" * 5000})
        assert answer.status_code == 431


def _endless_header(port: int) -> tuple[bytes, int]:
    """Send a header that never ends; return the answer and how many bytes got through."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nX-Big: ")
        chunk = b"a" * 65536
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the ingress closed the connection: what we want
        sock.settimeout(5)
        try:
            answer = sock.recv(200)
        except OSError:
            answer = b""
    return answer, sent


async def test_a_header_that_never_ends_is_cut_off_at_the_bound() -> None:
    async with stack(max_header_bytes=16 * 1024) as s:
        tracemalloc.start()
        try:
            answer, sent = await anyio.to_thread.run_sync(_endless_header, s.ingress.address[1])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert s.sample("connections_refused_total", reason="head-too-large") == 1
    assert sent < 64 * 1024 * 1024  # the ingress hung up long before the 64 MiB were sent
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431")
    assert peak < 16 * 1024 * 1024


@pytest.mark.parametrize(
    ("accept", "content_type", "marker"),
    [
        ("application/json", "application/json", '"error": "unknown host"'),
        ("text/html,application/xhtml+xml,*/*;q=0.8", "text/html", "<h1>404 unknown host</h1>"),
        ("*/*", "text/plain", "404 unknown host: no app is served at host 'x.localhost'"),
    ],
    ids=["json for APIs", "html for browsers", "text for curl"],
)
async def test_errors_come_in_the_clients_format(
    accept: str, content_type: str, marker: str
) -> None:
    async with stack() as s:
        answer = await s.client.get("/", headers={"Host": "x.localhost", "Accept": accept})
        assert answer.status_code == 404
        assert answer.headers["content-type"].startswith(content_type)
        assert marker in answer.text
        assert answer.headers["x-request-id"]


async def test_the_bounded_wait_answers_503_with_retry_after() -> None:
    async with stack({"sb-1": None}, activation_timeout=0.3) as s:
        answer = await s.client.get("/", headers={"Accept": "application/json"})
        assert answer.status_code == 503
        assert answer.json()["error"] == "no capacity"
        assert int(answer.headers["retry-after"]) >= 1
        assert s.sample("requests_queued", app="hello") == 0


CRASHING = {
    "crash_count": 3,
    "last_crash_log": "Traceback (most recent call last):\nImportError: no module x",
}


async def test_an_app_that_fails_to_boot_answers_503_with_its_log_when_allowed() -> None:
    crashing = {**CRASHING, "crash_cooldown_until": time.time() + 60}
    async with stack({"sb-1": None}, pool_update=crashing, show_boot_log=True) as s:
        answer = await s.client.get("/", headers={"Accept": "application/json"})
        assert answer.status_code == 503
        body = answer.json()
        assert body["error"] == "app failed to boot"
        assert "ImportError: no module x" in body["log"]
        assert int(answer.headers["retry-after"]) > 1
        text = await s.client.get("/")
        assert "ImportError: no module x" in text.text


async def test_a_boot_log_reaches_a_terminal_with_its_control_characters_shown() -> None:
    """`curl` prints the text answer on a terminal: the app's escape sequences in its boot log
    are shown there, not obeyed, and so in the HTML page; the JSON answer has the exact text."""
    crash_log = "Traceback:\n\x1b]52;c;cHduZWQ=\x07\x1b[2K\rImportError\x9b2J\u202e"
    crashing = {
        **CRASHING,
        "last_crash_log": crash_log,
        "crash_cooldown_until": time.time() + 60,
    }
    shown_log = "Traceback:\n\\x1b]52;c;cHduZWQ=\\x07\\x1b[2K\\rImportError\\x9b2J\\u202e"
    async with stack({"sb-1": None}, pool_update=crashing, show_boot_log=True) as s:
        text = await s.client.get("/", headers={"Accept": "*/*"})
        assert text.status_code == 503
        assert text.headers["content-type"].startswith("text/plain")
        # Each line of the app's log set off, so none passes for a line of wakeful's.
        assert text.text.endswith("\n  | " + shown_log.replace("\n", "\n  | ") + "\n")
        page = await s.client.get("/", headers={"Accept": "text/html"})
        assert f"<pre>{shown_log}</pre>" in page.text
        for body in (text.text, page.text):
            raw = [c for c in body if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0]
            assert not raw
            assert "\u202e" not in body
        exact = await s.client.get("/", headers={"Accept": "application/json"})
        assert exact.json()["log"] == crash_log


async def test_the_boot_log_is_not_shown_to_anonymous_clients_by_default() -> None:
    crashing = {**CRASHING, "crash_cooldown_until": time.time() + 60}
    async with stack({"sb-1": None}, pool_update=crashing) as s:
        answer = await s.client.get("/", headers={"Accept": "application/json"})
        assert answer.status_code == 503
        assert answer.json()["error"] == "app failed to boot"
        assert "log" not in answer.json()
        assert "ImportError" not in (await s.client.get("/")).text


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:8080", True),
        ("127.8.9.10:8080", True),
        ("localhost:8080", True),
        ("LOCALHOST:0", True),
        ("[::1]:8080", True),
        ("::1:8080", True),
        ("[::ffff:127.0.0.1]:8080", True),
        ("0.0.0.0:8080", False),
        ("[::]:8080", False),
        ("192.168.1.20:8080", False),
        ("10.0.0.1:80", False),
        ("[2001:db8::1]:8080", False),
        ("example.com:8080", False),
        ("localhost.example.com:8080", False),
        ("not an address", False),
    ],
)
def test_boot_logs_are_shown_only_on_a_loopback_listener(listen: str, loopback: bool) -> None:
    assert listens_on_loopback(listen) is loopback
    if " " in listen:  # no ingress listens there: its settings refuse it
        with pytest.raises(ValidationError, match="expected host:port"):
            IngressSettings(store_url="memory://", listen=listen)
        return
    shown = IngressSettings(store_url="memory://", listen=listen, show_boot_log=True)
    assert shown.boot_log_shown is loopback
    assert not IngressSettings(store_url="memory://", listen=listen).boot_log_shown


async def test_an_ingress_on_a_public_address_keeps_the_boot_log_out_even_when_asked() -> None:
    """As `wakeful up --listen 0.0.0.0:PORT` runs it: boot logs asked for, not shown."""
    crashing = {**CRASHING, "crash_cooldown_until": time.time() + 60}
    async with stack(
        {"sb-1": None}, pool_update=crashing, show_boot_log=True, listen="0.0.0.0:0"
    ) as s:
        answer = await s.client.get("/", headers={"Accept": "application/json"})
        assert answer.status_code == 503
        assert answer.json()["error"] == "app failed to boot"
        assert "log" not in answer.json()
        assert "ImportError" not in (await s.client.get("/")).text


async def test_a_flood_past_the_bound_is_refused_and_leaves_nothing_behind() -> None:
    waves, per_wave = 6, 100
    async with stack({"sb-1": None}, activation_timeout=0.3, activator={"max_waiters": 5}) as s:
        statuses: list[int] = []
        most_waiting = 0

        async def call(client: httpx.AsyncClient) -> None:
            answer = await client.get("/")
            assert "retry-after" in answer.headers
            statuses.append(answer.status_code)

        async def watch() -> None:
            nonlocal most_waiting
            while True:
                most_waiting = max(most_waiting, s.activator.snapshot()[0].waiters)
                await anyio.sleep(0.005)

        sizes = []
        tracemalloc.start()
        try:
            async with anyio.create_task_group() as watcher:
                watcher.start_soon(watch)
                for _ in range(waves):
                    # a fresh client per wave: httpx's pool slows badly when reused this wide
                    limits = httpx.Limits(max_connections=per_wave)
                    async with (
                        httpx.AsyncClient(
                            base_url=s.url, headers={"Host": "hello.localhost"}, limits=limits
                        ) as client,
                        anyio.create_task_group() as tg,
                    ):
                        for _ in range(per_wave):
                            tg.start_soon(call, client)
                    gc.collect()
                    sizes.append(tracemalloc.get_traced_memory()[0])
                watcher.cancel_scope.cancel()
        finally:
            tracemalloc.stop()
        assert statuses == [503] * waves * per_wave
        assert most_waiting <= 5
        assert s.activator.snapshot()[0].waiters == 0
        assert s.sample("requests_queued", app="hello") == 0
        # Once the first waves warmed every pool and cache, later waves leave nothing behind.
        # The memory traced is the whole process's: another thread (the session's etcd client,
        # an earlier test's leftovers) once allocated 4 MB during a wave, once. So one step may
        # jump; a leak grows with every wave, and the other three add up past the bound.
        steps = [after - before for before, after in itertools.pairwise(sizes[1:])]
        assert sum(steps) - max(steps) < 256 * 1024, sizes


def _exchange(port: int, request: bytes, then: bytes = b"", timeout: float = 30) -> bytes:
    """Send `request`; once something comes back, send `then`; return all that came back
    until the ingress answered in full (Connection: close) or closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        got = sock.recv(65536)
        if then:
            sock.sendall(then)
        while chunk := sock.recv(65536):
            got += chunk
    return got


def _echo_head(conn: socket.socket) -> None:
    """A sandbox answering with the request head it got (after reading a 5-byte body)."""
    data = read_head(conn)
    while len(data.split(b"\r\n\r\n", 1)[1]) < 5:
        data += conn.recv(65536)
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
    )


async def _via_echo(request: bytes, then: bytes = b"") -> tuple[bytes, int]:
    """`_exchange` through an ingress whose one sandbox echoes the head it got; the answer,
    and how many connections reached that sandbox."""
    with RawServer(_echo_head) as server:
        async with stack({"sb-1": server.port}) as s:
            answer = await anyio.to_thread.run_sync(_exchange, s.ingress.address[1], request, then)
    return answer, server.connections


async def test_two_host_headers_are_refused_before_any_sandbox_sees_them() -> None:
    answer, connections = await _via_echo(
        b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nHost: other.localhost\r\n"
        b"Connection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b"2 Host headers" in answer
    assert connections == 0


async def test_expect_100_continue_is_answered_by_the_ingress() -> None:
    """The client waits for 100 Continue before it sends its body: the ingress sends it (the
    sandbox never sees the Expect header, so it cannot stall the request)."""
    answer, _ = await _via_echo(
        b"POST /up HTTP/1.1\r\nHost: hello.localhost\r\nContent-Length: 5\r\n"
        b"Expect: 100-continue\r\nConnection: close\r\n\r\n",
        b"hello",
    )
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"), answer
    echoed = answer.split(b"\r\n\r\n", 2)[2].lower()
    assert echoed.startswith(b"post /up http/1.1")
    assert b"expect" not in echoed and echoed.endswith(b"hello")


def _ask(sock: socket.socket) -> bytes:
    """One keep-alive GET on an open connection: the answer's status line."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(
            line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        ).split(b":")[1]
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n", 1)[0]


def _until_closed(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


async def test_connections_that_do_not_complete_a_head_in_time_are_closed(
    hello: Callable[[], int],
) -> None:
    """A partial head (slowloris) gets 408 and is closed, a silent connection is closed, and
    one that was answered is closed when no next head follows; none is kept forever."""
    async with stack({"sb-1": hello()}, client_header_timeout=2, client_keepalive=3600) as s:
        address = ("127.0.0.1", s.ingress.address[1])

        def clients() -> tuple[bytes, bytes, bytes, bytes]:
            with (
                socket.create_connection(address, timeout=30) as partial,
                socket.create_connection(address, timeout=30) as silent,
                socket.create_connection(address, timeout=30) as answered,
            ):
                partial.sendall(b"GET / HTTP/1.1\r\nHost: hel")
                status = _ask(answered)
                return (
                    status,
                    _until_closed(partial),
                    _until_closed(silent),
                    _until_closed(answered),
                )

        status, partial, silent, answered = await anyio.to_thread.run_sync(clients)
        assert s.sample("connections_refused_total", reason="slow-head") == 1  # not `silent`
    assert status == b"HTTP/1.1 200 OK"
    assert partial.startswith(b"HTTP/1.1 408"), partial
    assert silent == b"" and answered == b""


async def test_past_the_connection_cap_a_new_connection_gets_503_and_open_ones_keep_working(
    hello: Callable[[], int],
) -> None:
    async with stack({"sb-1": hello()}, max_client_connections=2) as s:
        address = ("127.0.0.1", s.ingress.address[1])

        def clients() -> tuple[bytes, bytes, bytes, bytes]:
            with (
                socket.create_connection(address, timeout=30) as first,
                socket.create_connection(address, timeout=30) as second,
            ):
                before = _ask(first) + _ask(second)  # both accepted and served
                with socket.create_connection(address, timeout=30) as third:
                    refused = _until_closed(third)
                return before, refused, _ask(first), _ask(second)

        before, refused, first, second = await anyio.to_thread.run_sync(clients)
        assert s.sample("connections_refused_total", reason="connections") == 1
    assert before == b"HTTP/1.1 200 OK" * 2
    assert refused.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in refused
    assert first == second == b"HTTP/1.1 200 OK"


def _swallow(conn: socket.socket) -> None:
    """A sandbox that reads until the ingress hangs up, and never answers."""
    _until_closed(conn)


def _flood(conn: socket.socket) -> None:
    """A sandbox answering with 256 MiB, until the ingress stops taking them."""
    read_head(conn)
    size = 256 << 20
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    chunk = b"x" * (1 << 20)
    with contextlib.suppress(OSError):
        for _ in range(size // len(chunk)):
            conn.sendall(chunk)


def _nothing_held(s: Stack) -> bool:
    return s.sample("requests_in_flight", app="hello") == 0 and all(
        e.uses == 0 for e in s.ingress.cache.snapshot()
    )


async def test_a_client_silent_mid_body_gets_408_and_gives_its_capacity_back() -> None:
    with RawServer(_swallow) as server:
        async with stack({"sb-1": server.port}, client_timeout=0.3) as s:
            answer = await anyio.to_thread.run_sync(
                _exchange,
                s.ingress.address[1],
                b"POST / HTTP/1.1\r\nHost: hello.localhost\r\nContent-Length: 10\r\n\r\nhalf!",
            )
            assert answer.startswith(b"HTTP/1.1 408"), answer
            await eventually(lambda: _nothing_held(s))


async def test_a_client_that_stops_reading_is_cut_off_and_gives_its_capacity_back() -> None:
    with RawServer(_flood) as server:
        async with stack({"sb-1": server.port}, client_timeout=0.3) as s:
            address = ("127.0.0.1", s.ingress.address[1])
            with socket.create_connection(address, timeout=30) as client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                client.sendall(b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n")
                await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1)
                # Not reading: the ingress's writes block, then it gives up on this client.
                await eventually(lambda: _nothing_held(s), within=60)
                assert s.sample("requests_total", app="hello", status_class="4xx") == 1  # 499


async def test_an_early_answer_reaches_a_client_still_sending_its_body() -> None:
    """A refusal answered before the body is read (here: no such app) must not be lost to a
    reset: the ingress half-closes after its answer and reads the rest away (a lingering close,
    as nginx does), instead of closing with the client's bytes unread, which makes the kernel
    reset the connection: a client that reads only once it has sent all (curl, most HTTP
    libraries) then fails to send and never sees the answer."""
    async with stack() as s:
        host, port = s.ingress.address

        def send_then_read(size: int = 8 << 20) -> tuple[bytes, str]:
            body = b"x" * size
            with socket.create_connection((host, port), timeout=30) as conn:
                conn.sendall(
                    b"POST / HTTP/1.1\r\nHost: nosuch.localhost\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body)
                )
                sent, how = 0, "sent all"
                try:
                    while sent < len(body):
                        sent += conn.send(body[sent : sent + 65536])
                except OSError as exc:  # the ingress stopped reading: fine, if it answered
                    how = type(exc).__name__
                with contextlib.suppress(OSError):  # not connected any more: reset
                    conn.shutdown(socket.SHUT_WR)
                answer = b""
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(65536):
                        answer += chunk
                return answer, how

        for _ in range(3):
            answer, how = await anyio.to_thread.run_sync(send_then_read)
            assert answer.startswith(b"HTTP/1.1 404"), (answer[:200], how)
            assert how == "sent all"  # a client that reads only once it has sent (curl) too
        # Bounded: past LINGER_BYTES (16 MiB) nothing more is read away; the connection goes.
        answer, how = await anyio.to_thread.run_sync(send_then_read, 64 << 20)
        assert how != "sent all"
