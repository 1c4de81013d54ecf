"""HTTP/2 clients through the ingress (`ingress.http2`), with httpx's HTTP/2 client (h2) and
hello sandboxes speaking HTTP/1.1: h2c with prior knowledge beside HTTP/1.1 on the plain
listener, h2 by ALPN on the TLS one; bodies both ways past every window; streams multiplexed
on one connection, each its own request for leases and counts; error answers; HEAD; and
HTTP/2 turned off."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import anyio
import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from tests.support.certs import ingress_pki
from tests.support.ingress import Stack, stack
from wakeful.ingress.http2.rules import PREFACE

pytestmark = pytest.mark.anyio


def h2c(s: Stack, host: str = "hello.localhost") -> httpx.AsyncClient:
    """An HTTP/2-only client with prior knowledge (no Upgrade dance) on the plain listener."""
    return httpx.AsyncClient(
        base_url=s.url, http1=False, http2=True, headers={"host": host}, timeout=30
    )


async def test_h2c_and_http11_share_the_plain_listener_and_bodies_cross_every_window(
    hello: Callable[[], int],
) -> None:
    async with stack({"s1": hello()}) as s, h2c(s) as client:
        answer = await client.get("/headers")
        assert answer.status_code == 200 and answer.http_version == "HTTP/2"
        seen = answer.text.lower()  # what the sandbox got: HTTP/1.1, its host, forwarded
        assert "host: hello.localhost" in seen and "x-forwarded-proto: http" in seen
        assert answer.headers["x-request-id"]
        body = bytes(range(256)) * 4096  # 1 MiB: past the stream's and the connection's window
        posted = await client.post("/echo", content=body)
        assert posted.status_code == 200
        assert posted.headers["x-body-sha256"] == hashlib.sha256(body).hexdigest()
        assert posted.content == body
        big = await client.get("/bytes", params={"n": str(8 << 20)})
        assert len(big.content) == 8 << 20 and big.content == b"w" * (8 << 20)
        plain = await s.client.get("/")  # HTTP/1.1 on the same listener, meanwhile
        assert plain.status_code == 200 and plain.http_version == "HTTP/1.1"
        assert s.sample("http2_connections_open") == 1


async def test_streams_on_one_connection_are_requests_each(hello: Callable[[], int]) -> None:
    async with stack({"s1": hello(), "s2": hello()}, rpi=2) as s, h2c(s) as client:
        answers = await asyncio.gather(
            *(client.get("/sleep", params={"s": "0.3"}) for _ in range(12))
        )
        assert all(a.status_code == 200 and a.http_version == "HTTP/2" for a in answers)
        # Twelve at once on one connection: each took a lease use and was counted as a
        # request; none is in flight once all are answered.
        assert s.sample("requests_total", app="hello", status_class="2xx") == 12
        assert len({a.text.split(" instance ")[1] for a in answers}) == 2
        assert s.sample("requests_in_flight", app="hello") == 0


async def test_head_and_errors_read_as_on_http11(hello: Callable[[], int]) -> None:
    async with stack({"s1": hello()}) as s, h2c(s) as client:
        head = await client.head("/")  # hello answers HEAD 501, with a body HEAD drops
        assert head.status_code == 501 and head.content == b""
        assert int(head.headers["content-length"]) > 0
        unknown = await client.get(
            "/", headers={"host": "nope.localhost", "accept": "application/json"}
        )
        assert unknown.status_code == 404
        assert unknown.json()["error"] == "unknown host"
        assert unknown.json()["request_id"] == unknown.headers["x-request-id"]


async def test_h2_over_tls_by_alpn_and_http11_for_those_that_ask(
    hello: Callable[[], int], tmp_path: Path
) -> None:
    ca, certs = ingress_pki(tmp_path)
    context = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    context.check_hostname = False
    async with stack({"s1": hello()}, tls_listen="127.0.0.1:0", tls_dir=certs) as s:
        port = s.ingress.tls_address[1]
        url = f"https://127.0.0.1:{port}"
        async with httpx.AsyncClient(
            base_url=url, http2=True, verify=context, headers={"host": "hello.localhost"}
        ) as client:
            answer = await client.get("/headers")
            assert answer.status_code == 200 and answer.http_version == "HTTP/2"
            assert "x-forwarded-proto: https" in answer.text.lower()
        async with httpx.AsyncClient(
            base_url=url, verify=context, headers={"host": "hello.localhost"}
        ) as client:
            answer = await client.get("/")
            assert answer.status_code == 200 and answer.http_version == "HTTP/1.1"


def _first_bytes(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        return conn.recv(4096)


def _alpn(port: int, ca: Path) -> str | None:
    """The protocol ALPN picks for a client offering h2 first."""
    context = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    context.check_hostname = False
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="shop.example.com") as tls,
    ):
        return tls.selected_alpn_protocol()


async def test_with_http2_off_the_preface_is_a_bad_http11_request(
    hello: Callable[[], int], tmp_path: Path
) -> None:
    ca, certs = ingress_pki(tmp_path)
    async with stack({"s1": hello()}, http2=False, tls_listen="127.0.0.1:0", tls_dir=certs) as s:
        answer = await anyio.to_thread.run_sync(_first_bytes, s.ingress.address[1], PREFACE)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        chosen = await anyio.to_thread.run_sync(_alpn, s.ingress.tls_address[1], ca)
        assert chosen == "http/1.1"
    async with stack({"s1": hello()}, tls_listen="127.0.0.1:0", tls_dir=certs) as s:
        # On (the default): the same bytes open HTTP/2, and ALPN offers it.
        answer = await anyio.to_thread.run_sync(_first_bytes, s.ingress.address[1], PREFACE)
        assert answer[3] == 4, answer  # a SETTINGS frame: the server's side of the preface
        assert await anyio.to_thread.run_sync(_alpn, s.ingress.tls_address[1], ca) == "h2"


async def test_bodies_answered_unread_give_the_connection_window_back(
    hello: Callable[[], int],
) -> None:
    """Twenty 64 KiB bodies refused before they were read (an unknown host: 404), 1.25 MiB on
    one connection, past its 1 MiB window: each stream's unread bytes are acknowledged as it
    ends, so the client can always send (with h2 as the client: it holds to the windows)."""
    async with stack({"s1": hello()}) as s:
        reader, writer = await asyncio.open_connection(*s.ingress.address)
        client = h2.connection.H2Connection(h2.config.H2Configuration(header_encoding=None))
        client.initiate_connection()
        writer.write(client.data_to_send())
        for _ in range(20):
            stream = client.get_next_available_stream_id()
            head = [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":authority", b"nope.localhost"),
                (b":path", b"/"),
            ]
            client.send_headers(stream, head)
            for _ in range(4):  # 64 KiB (less a byte): raises once the connection's window shuts
                client.send_data(stream, b"x" * (16_384 - (1 if _ == 3 else 0)))
            writer.write(client.data_to_send())
            status = b""
            with anyio.fail_after(10):
                while not status:
                    for event in client.receive_data(await reader.read(65_536)):
                        if isinstance(event, h2.events.ResponseReceived):
                            status = dict(event.headers)[b":status"]
            assert status == b"404"
            writer.write(client.data_to_send())
        writer.close()
