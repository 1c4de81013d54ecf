"""The direct path (`ingress.direct`): a request with no body, a cached lease with room and an
idle pooled connection is answered in callbacks. It must be the general path in every byte:
the same requests give the sandbox the same heads and the client the same answers, counted
the same, with it on (the default) and off (`direct_path=False`). And what only it does: a
client whose buffer fills gets the rest from a task, the keep-alive race's resend goes the
general path under the same id, a client that leaves ends the exchange and gives back what it
held, and a stopping ingress lets it finish."""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Callable

import anyio
import h11
import pytest

from tests.support.ingress import RawServer, read_head, stack
from tests.support.waiting import eventually
from wakeful.ingress.upstream.raw import RawTransport

BIG = 4 << 20
"""An answer larger than the client's buffers (`/big`)."""
HUGE = 64 << 20
"""An answer larger than every buffer between the sandbox and the client together (`/huge`):
while the client reads none, the sandbox cannot send it all."""

ANSWERS: dict[bytes, bytes] = {
    b"/small": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok",
    b"/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    ),
    b"/hop": (  # hop-by-hop headers, one the Connection header names, the sandbox's own id
        b"HTTP/1.1 200 OK\r\nConnection: x-secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\n"
        b"X-Request-Id: theirs\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\nok"
    ),
    b"/empty": b"HTTP/1.1 204 No Content\r\nX-Kept: yes\r\n\r\n",
    b"/missing": b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope",
    b"/early": (  # an interim answer first: not relayed on HTTP/1.1
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nafter"
    ),
    b"/big": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (BIG, b"b" * BIG),
    b"/short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf!",  # then it closes
    b"/eof": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",  # then it closes
    b"/extra": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",  # more than it said
}


class Sandbox:
    """Serves its connections' requests in turn (`RawServer`, one connection at a time),
    keeping each head and answering by path from `ANSWERS` (a HEAD's answer without its
    body); `/short` and `/eof` close their connection after their answer, `/slow` answers
    after 0.5 s,
    `/huge` is `HUGE` bytes, and when the last of it went is kept (`huge_sent`)."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.huge_sent = 0.0

    def __call__(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                self.heads.append(head)
                path = head.split(b" ")[1].split(b"?")[0]
                if path == b"/slow":
                    time.sleep(0.5)
                if path == b"/huge":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
                    for _ in range(HUGE >> 20):
                        conn.sendall(b"h" * (1 << 20))
                    self.huge_sent = time.monotonic()
                    continue
                answer = ANSWERS.get(path, ANSWERS[b"/small"])
                if head.startswith(b"HEAD "):
                    answer = answer.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
                conn.sendall(answer)
                if path in (b"/short", b"/eof"):
                    return
        except OSError:
            return


def exchange(sock: socket.socket, request: bytes, head_only: bool = False) -> bytes:
    """Send `request`, return the answer's bytes exactly as they came (framed by h11, the
    oracle), or what came before the connection ended."""
    sock.sendall(request)
    parser = h11.Connection(h11.CLIENT)
    method = "HEAD" if head_only else "GET"
    parser.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
    got: list[bytes] = []
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError:  # it ended mid-answer
            break
        if event is h11.NEED_DATA:
            chunk = sock.recv(1 << 20)
            got.append(chunk)
            parser.receive_data(chunk)
            if not chunk:
                break
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    return b"".join(got)


def get(path: bytes, n: int, method: bytes = b"GET") -> bytes:
    return (
        b"%s %s HTTP/1.1\r\nHost: hello.localhost\r\nX-Request-Id: t-%d\r\n"
        b"X-Forwarded-For: 6.6.6.6\r\nConnection: keep-alive, x-mine\r\nX-Mine: 1\r\n"
        b"Accept: */*\r\n\r\n" % (method, path, n)
    )


SEQUENCE = [
    b"/small",
    b"/chunked",
    b"/hop",
    b"/empty",
    b"/missing",
    b"/early",
    b"/big",
    b"/small?q=1",
    b"/eof",
    b"/small",  # on a new connection: `/eof` closed the last
    b"/extra",
    b"/small",  # on a new connection: the ingress dropped the last
]
DIRECT = len(SEQUENCE) - 2 + 2
"""How many take the direct path: all of `SEQUENCE` but the two after a connection ended,
then `/short`, and the HEAD (after a GET that dialed: `/short`'s connection closed)."""


async def _through(direct: bool) -> tuple[list[bytes], list[bytes], dict[str, float]]:
    """`SEQUENCE` on one connection, a Host that is no host, then `/short` (its answer breaks
    mid-body), then on a second connection a GET and a CONNECT, on a third a HEAD, after a first
    request that leaves a connection pooled: the heads the sandbox got, the answers the client
    got, and the counts."""
    sandbox = Sandbox()
    with RawServer(sandbox) as server:
        async with stack({"sb-a": server.port}, direct_path=direct) as s:
            assert (await s.client.get("/small")).status_code == 200  # a lease, a pooled conn
            sandbox.heads.clear()
            host, port = s.ingress.address

            def talk() -> list[bytes]:
                with socket.create_connection((host, port), timeout=10) as sock:
                    answers = [exchange(sock, get(path, n)) for n, path in enumerate(SEQUENCE)]
                    bad_host = get(b"/small", 92).replace(b"hello.localhost", b"a b", 1)
                    answers.append(exchange(sock, bad_host))  # a 400, kept alive
                    answers.append(exchange(sock, get(b"/short", 91)))
                with socket.create_connection((host, port), timeout=10) as sock:
                    answers.append(exchange(sock, get(b"/small", 94)))  # dials; pooled after
                    answers.append(exchange(sock, get(b"/x", 93, b"CONNECT")))  # then closed
                with socket.create_connection((host, port), timeout=10) as sock:
                    answers.append(exchange(sock, get(b"/small", 90, b"HEAD"), head_only=True))
                return answers

            answers = await anyio.to_thread.run_sync(talk)
            counts = {
                name: s.sample(name, **labels)
                for name, labels in (
                    ("requests_total", {"app": "hello", "status_class": "2xx"}),
                    ("requests_total", {"app": "hello", "status_class": "4xx"}),
                    ("requests_total", {"app": "hello", "status_class": "5xx"}),
                    ("lease_cache_hits_total", {"app": "hello"}),
                    ("upstream_errors_total", {"app": "hello", "kind": "failed"}),
                    ("direct_requests_total", {"app": "hello"}),
                )
            }
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
    return sandbox.heads, answers, counts


async def test_the_direct_path_is_the_general_path_in_every_byte() -> None:
    direct_heads, direct_answers, direct_counts = await _through(direct=True)
    general_heads, general_answers, general_counts = await _through(direct=False)
    assert direct_heads == general_heads
    assert len(direct_heads) == len(SEQUENCE) + 3  # not the bad Host, not the CONNECT
    assert b"x-forwarded-for: 127.0.0.1" in direct_heads[0]  # the rules ran: the
    assert b"x-mine" not in direct_heads[0].lower()  # client's chain and named headers gone
    for n, (direct, general) in enumerate(zip(direct_answers, general_answers, strict=True)):
        assert direct == general, f"answer {n}"
    assert b"x-secret" not in direct_answers[2].lower()
    assert b"x-request-id: t-2" in direct_answers[2]
    n = len(SEQUENCE)
    assert direct_answers[SEQUENCE.index(b"/eof")].endswith(b"to the end\r\n0\r\n\r\n")
    assert direct_answers[SEQUENCE.index(b"/extra")].endswith(b"\r\n\r\nok")
    assert direct_answers[n].startswith(b"HTTP/1.1 400 Bad Request")  # the Host
    assert direct_answers[n + 1].startswith(b"HTTP/1.1 200 OK")  # cut off after its "half!"
    assert direct_answers[n + 1].endswith(b"half!")
    assert direct_answers[n + 3].startswith(b"HTTP/1.1 400 Bad Request")  # the CONNECT
    assert direct_answers[n + 4].startswith(b"HTTP/1.1 200 OK")  # the HEAD, on the pooled
    direct_taken = direct_counts.pop("direct_requests_total")
    assert general_counts.pop("direct_requests_total") == 0
    assert direct_taken == DIRECT
    assert direct_counts == general_counts


def _answer_then_close(heads: list[bytes]) -> Callable[[socket.socket], None]:
    """Answer one request, then read the next and close without a word (the keep-alive race
    a pooled connection loses when the sandbox's idle timeout fires as a request goes out)."""

    def handle(conn: socket.socket) -> None:
        heads.append(read_head(conn))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        heads.append(read_head(conn))

    return handle


@pytest.mark.parametrize(
    ("method", "status", "sends", "direct"), [("GET", 200, 3, 0), ("POST", 502, 2, 1)]
)
async def test_the_keep_alive_race_resends_under_the_same_id(
    method: str, status: int, sends: int, direct: int
) -> None:
    """A pooled connection closed unanswered: an idempotent request is sent once more (the
    general path, a fresh connection) with the id it went out with (the ingress's: the client
    sent none), and counted once, as the general path's; a POST is not sent again."""
    heads: list[bytes] = []
    with RawServer(_answer_then_close(heads)) as server:
        async with stack({"sb-a": server.port}) as s:
            assert (await s.client.get("/")).status_code == 200
            hits = s.sample("lease_cache_hits_total", app="hello")
            answer = await s.client.request(method, "/")
            assert answer.status_code == status, answer.text
            assert s.sample("direct_requests_total", app="hello") == direct
            assert s.sample("lease_cache_hits_total", app="hello") == hits + 1
            sent = [re.findall(rb"x-request-id: ([^\r]+)", head) for head in heads]
            assert len(sent) == sends
            assert sent[1:] == [[answer.headers["x-request-id"].encode()]] * (sends - 1)
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
            assert s.sample("requests_in_flight", app="hello") == 0


async def test_a_client_reading_slowly_holds_the_sandbox_back_and_gets_it_all() -> None:
    """The client's buffer fills mid-answer: the rest goes from a task that waits for the
    client, so the sandbox is held back (nothing buffers without bound) until it reads, and
    the answer arrives whole, in order, with the connection ready for the next."""
    sandbox = Sandbox()
    with RawServer(sandbox) as server:
        async with stack({"sb-a": server.port}) as s:
            assert (await s.client.get("/small")).status_code == 200
            host, port = s.ingress.address

            def slow() -> tuple[float, bytes]:
                with socket.create_connection((host, port), timeout=10) as sock:
                    sock.sendall(get(b"/huge", 1))
                    time.sleep(1.0)  # the ingress writes meanwhile, until every buffer is full
                    reading = time.monotonic()
                    got = exchange(sock, b"")
                    return reading, got + exchange(sock, get(b"/small", 2))

            reading, got = await anyio.to_thread.run_sync(slow)
            assert sandbox.huge_sent > reading
            head, _, rest = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert rest[:HUGE] == b"h" * HUGE
            assert rest[HUGE:].startswith(b"HTTP/1.1 200 OK") and rest.endswith(b"ok")
            assert s.sample("direct_requests_total", app="hello") == 2


async def test_a_client_that_leaves_ends_the_exchange_and_gives_back_what_it_held() -> None:
    with RawServer(Sandbox()) as server:
        async with stack({"sb-a": server.port}) as s:
            assert (await s.client.get("/small")).status_code == 200
            host, port = s.ingress.address
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(get(b"/slow", 1))
                await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1, 10)
            # 499 (the client gone), before the sandbox answered
            await eventually(
                lambda: s.sample("requests_total", app="hello", status_class="4xx"), 10
            )
            assert s.sample("requests_total", app="hello", status_class="2xx") == 1
            assert s.sample("direct_requests_total", app="hello") == 1
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
            assert (await s.client.get("/small")).status_code == 200  # the next still served


async def test_a_stopping_ingress_lets_a_direct_exchange_finish() -> None:
    got: list[bytes] = []
    with RawServer(Sandbox()) as server:
        async with stack({"sb-a": server.port}) as s:
            assert (await s.client.get("/small")).status_code == 200
            host, port = s.ingress.address

            def ask() -> None:
                with socket.create_connection((host, port), timeout=10) as sock:
                    got.append(exchange(sock, get(b"/slow", 1)))

            thread = threading.Thread(target=ask)
            thread.start()
            await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1, 10)
        thread.join(10)
    assert got and got[0].startswith(b"HTTP/1.1 200 OK"), got
    assert b"connection: close" in got[0]


class _RaceThenSlow:
    """A sandbox whose first connection answers one request, then closes 0.3 s after the next
    came (the keep-alive race, late); every later connection answers after 0.5 s."""

    def __init__(self) -> None:
        self.connections = 0

    def __call__(self, conn: socket.socket) -> None:
        self.connections += 1
        read_head(conn)
        if self.connections == 1:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            read_head(conn)
            time.sleep(0.3)
            return
        time.sleep(0.5)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nresent!")


async def test_a_stopping_ingress_lets_a_resend_finish() -> None:
    """The ingress stops while a direct exchange waits; its connection then loses the
    keep-alive race, and the resend the general path makes is what the stop waits for,
    within its grace."""
    sandbox = _RaceThenSlow()
    got: list[bytes] = []
    with RawServer(sandbox) as server:
        async with stack({"sb-a": server.port}) as s:
            assert (await s.client.get("/")).status_code == 200
            host, port = s.ingress.address

            def ask() -> None:
                with socket.create_connection((host, port), timeout=10) as sock:
                    got.append(exchange(sock, get(b"/", 1)))

            thread = threading.Thread(target=ask)
            thread.start()
            await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1, 10)
        thread.join(10)
    assert got and got[0].startswith(b"HTTP/1.1 200 OK"), got
    assert got[0].endswith(b"resent!")


async def test_a_client_leaving_mid_relay_ends_it_and_gives_back_what_it_held() -> None:
    """The client's buffer filled and a task relays the rest; the client leaves: the request
    ends (499), its lease use and upstream slot go back, and the next is served."""
    sandbox = Sandbox()
    with RawServer(sandbox) as server:
        async with stack({"sb-a": server.port}) as s:
            assert (await s.client.get("/small")).status_code == 200
            host, port = s.ingress.address
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(get(b"/huge", 1))
                await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1, 10)
                await anyio.sleep(0.5)  # the ingress writes meanwhile, until the buffers fill
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await eventually(
                lambda: s.sample("requests_total", app="hello", status_class="4xx"), 10
            )
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
            transport = s.ingress.transport
            assert isinstance(transport, RawTransport)
            assert not transport.slots.busy  # the app's upstream slot back
            assert (await s.client.get("/small")).status_code == 200
