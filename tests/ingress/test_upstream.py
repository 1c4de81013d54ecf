"""Retries, upstream failures and timeouts through the real stack (invariant 11)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from .conftest import RawServer, closed_port, read_head, reset_after_reading, stack

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


async def test_a_reset_after_the_request_was_sent_is_not_retried(
    hello: Callable[[], int],
) -> None:
    with RawServer(reset_after_reading) as broken:
        async with stack({"sb-a": broken.port, "sb-b": hello()}) as s:
            answer = await s.client.get("/")
            assert answer.status_code == 502, answer.text
            assert broken.connections == 1
            assert s.sample("connect_retries_total", app="hello") == 0
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 1
            assert s.sample("requests_in_flight", app="hello") == 0
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())


async def test_a_silent_sandbox_times_out_with_504(hello: Callable[[], int]) -> None:
    async with stack({"sb-1": hello()}, request_timeout=0.3) as s:
        answer = await s.client.get("/sleep?s=2")
        assert answer.status_code == 504
        assert "upstream timed out" in answer.text
        assert s.sample("upstream_errors_total", app="hello", kind="timeout") == 1
        assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
    async with stack({"sb-1": hello()}, request_timeouts={"hello": 5.0}, request_timeout=0.3) as s:
        assert (await s.client.get("/sleep?s=0.6")).status_code == 200  # per-app override


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
