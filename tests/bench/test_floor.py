"""The floor (`bench/floor.py`) is a baseline the benchmarks print beside the ingress: it must
proxy, or its figures mean nothing. Run as `bench.proxy` runs it, against the bench's own
sandbox, both subprocesses."""

from __future__ import annotations

import socket
import sys

import pytest

from bench.proxy import process
from wakeful.store.testing import free_port


def exchange(port: int, request: bytes, answers: int) -> bytes:
    """`request` sent on one connection; what came back once `answers` answers did (or the
    connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        got = b""
        while got.count(b"HTTP/1.1 200 OK") < answers or not got.endswith(b"ok"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


@pytest.mark.parametrize("mode", [[], ["--rules"]], ids=["bare", "rules"])
def test_the_floor_relays_requests_on_kept_and_closed_connections(mode: list[str]) -> None:
    sandbox, floor = free_port(), free_port()
    with (
        process([sys.executable, "-m", "bench.proxy", "--sandbox", str(sandbox)], sandbox),
        process([sys.executable, "-m", "bench.floor", str(floor), str(sandbox), *mode], floor),
    ):
        kept = b"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: r-1\r\n\r\n"
        for _ in range(3):  # each time over the pooled upstream connection of the last
            answer = exchange(floor, kept, 1)
            assert answer.endswith(b"\r\n\r\nok")
            if mode:  # the ingress's rules: the client's request id echoed
                assert b"\r\nx-request-id: r-1\r\n" in answer
        closing = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", floor), timeout=5) as conn:
            conn.sendall(closing)
            got = b""
            while chunk := conn.recv(65536):  # the floor closes after the answer
                got += chunk
        assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"ok")
        assert exchange(floor, b"NOT HTTP\r\n\r\n", 1) == b""  # refused: closed, no answer
