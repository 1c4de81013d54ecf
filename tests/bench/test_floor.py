"""The floor (`bench/floor.py`) is a baseline the benchmarks print beside the ingress: it must
proxy as they use it, or its figures mean nothing. It runs as the benchmarks run it (a
subprocess), in front of a sandbox that answers each request with its own head and the serial
number of the connection it came on."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from bench.harness import process
from wakeful.store.testing import free_port


class _Echo(socketserver.BaseRequestHandler):
    """Answers each request head with a body of `serial N` (N: this connection's) and the
    head as it came; a GET of /slow... after 0.3 s."""

    serials = itertools.count(1)

    def handle(self) -> None:
        serial = next(self.serials)
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            if head.startswith(b"GET /slow"):  # others come meanwhile, on other connections
                time.sleep(0.3)
            body = b"serial %d\r\n%s" % (serial, head)
            answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            self.request.sendall(answer)


@pytest.fixture(scope="module", params=[[], ["--rules"]], ids=["bare", "rules"])
def floor(request: pytest.FixtureRequest) -> Iterator[tuple[int, bool]]:
    """The floor's port, and whether it applies the ingress's rules."""
    echo = type("Echo", (_Echo,), {"serials": itertools.count(1)})  # this sandbox's own
    sandbox = socketserver.ThreadingTCPServer(("127.0.0.1", 0), echo)
    sandbox.block_on_close = True  # its threads end once the floor's connections do
    serving = threading.Thread(target=sandbox.serve_forever, daemon=True)
    serving.start()
    port = free_port()
    argv = [sys.executable, "-m", "bench.floor", str(port), str(sandbox.server_address[1])]
    try:
        with process([*argv, *request.param], port):
            yield port, bool(request.param)
    finally:
        sandbox.shutdown()
        sandbox.server_close()


def connect(port: int) -> contextlib.closing[http.client.HTTPConnection]:
    return contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=5))


def get(conn: http.client.HTTPConnection, path: str, **headers: str) -> tuple[str, str]:
    """The answer's headers (as text) and body of a GET of `path` on `conn`."""
    conn.request("GET", path, headers=headers)
    answer = conn.getresponse()
    assert answer.status == 200
    return str(answer.headers).lower(), answer.read().decode()


def test_requests_on_one_connection_share_a_pooled_upstream_connection(
    floor: tuple[int, bool],
) -> None:
    port, ruled = floor
    with connect(port) as conn:
        bodies = [get(conn, f"/n{i}", Connection="keep-alive")[1] for i in range(3)]
    with connect(port) as later:
        bodies.append(get(later, "/later")[1])
    serials = {body.split("\r\n")[0] for body in bodies}
    assert len(serials) == 1, bodies  # one upstream connection, kept and reused
    for i, body in enumerate(bodies[:3]):
        sent = body.lower()
        assert sent.split("\r\n")[1] == f"get /n{i} http/1.1"
        assert "x-forwarded-for: 127.0.0.1" in sent
        assert "connection:" not in sent  # this hop's: never the sandbox's
        if ruled:
            assert "x-forwarded-proto: http" in sent and "x-request-id: " in sent


def test_clients_in_flight_together_each_get_their_own_answer(floor: tuple[int, bool]) -> None:
    port, _ = floor
    with connect(port) as first, connect(port) as second:
        first.request("GET", "/slow-first")
        second.request("GET", "/slow-second")
        assert "GET /slow-second HTTP/1.1" in second.getresponse().read().decode()
        assert "GET /slow-first HTTP/1.1" in first.getresponse().read().decode()


def test_a_client_asking_to_close_is_told_so_and_closed(floor: tuple[int, bool]) -> None:
    port, _ = floor
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /bye HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        got = b""
        while chunk := conn.recv(65536):  # the floor closes after the answer
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"\r\nconnection: close" in head.lower()  # as nginx says it: wrk reconnects
    assert b"GET /bye HTTP/1.1" in body and b"connection" not in body.lower()


@pytest.mark.parametrize("floor", [["--rules"]], ids=["rules"], indirect=True)
def test_the_rules_are_applied(floor: tuple[int, bool]) -> None:
    port, ruled = floor
    assert ruled
    with connect(port) as conn:
        headers, body = get(conn, "/", **{"X-Request-Id": "r-1", "X-Forwarded-For": "6.6.6.6"})
    assert "x-request-id: r-1" in headers  # the client's id, echoed
    sent = body.lower()
    assert "x-request-id: r-1" in sent and "x-forwarded-host: 127.0.0.1" in sent
    assert "6.6.6.6" not in sent  # an untrusted peer's chain is not kept
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        assert raw.recv(65536) == b""  # two Host headers: refused, no answer


def test_malformed_requests_are_closed_unanswered(floor: tuple[int, bool]) -> None:
    port, _ = floor
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"NOT HTTP\r\n\r\n")
        assert conn.recv(65536) == b""
