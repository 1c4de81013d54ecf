"""TLS on the ingress (`ingress.tls`), with a CA and certificates made by openssl in the test:
the certificate is chosen by SNI (exact, wildcard, default); a request over TLS is routed by its
Host and reaches the sandbox marked https; changed files are served to new connections without
a restart, and a bad change leaves the certificates in use; an app can send plain HTTP to
HTTPS; handshakes are bounded. A directory that cannot serve: test_tls_config.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvloop

from tests.support.certs import ingress_pki, issue
from tests.support.ingress import RawServer, Stack, read_head, stack, talk
from wakeful.ingress.http1 import Request, Responder
from wakeful.ingress.http1.server import Handling, HttpServer, Limits
from wakeful.ingress.http1.tlsaccept import SPARES
from wakeful.ingress.ports import bind_listener
from wakeful.ingress.tls import Certificates

pytestmark = pytest.mark.anyio


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, Path]:
    """(the CA's directory, the ingress's certificate directory)."""
    return ingress_pki(tmp_path)


def fetch(
    port: int, ca: Path, sni: str | None, host: bytes = b"hello.localhost"
) -> tuple[str, bytes]:
    """(the CN of the certificate served for `sni`, the answer to a GET with `host`)."""
    context = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    context.check_hostname = False  # the chain is checked; which name it is, the caller does
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=sni) as tls,
    ):
        subject = dict(pair[0] for pair in tls.getpeercert()["subject"])  # type: ignore[index]
        tls.sendall(b"GET /where?x=1 HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host)
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    return str(subject["commonName"]), answer


def sandbox_recording(seen: list[bytes]) -> RawServer:
    def answer(conn: socket.socket) -> None:
        while head := read_head(conn):
            seen.append(head)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    return RawServer(answer)


async def test_the_certificate_is_chosen_by_sni_and_requests_reach_the_app_as_https(
    pki: tuple[Path, Path],
) -> None:
    ca, certs = pki
    seen: list[bytes] = []
    with sandbox_recording(seen) as sandbox:
        async with stack({"s1": sandbox.port}, tls_listen="127.0.0.1:0", tls_dir=certs) as s:
            port = s.ingress.tls_address[1]
            cases = {
                "shop.example.com": "shop.example.com",
                "a.apps.example.com": "*.apps.example.com",
                "a.b.apps.example.com": "fallback.example",  # a wildcard is one label deep
                "unknown.example.org": "fallback.example",
                None: "fallback.example",  # no SNI at all
            }
            for sni, expected in cases.items():
                cn, answer = await anyio.to_thread.run_sync(fetch, port, ca, sni)
                assert cn == expected, sni
                assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert seen and all(b"x-forwarded-proto: https" in head for head in seen)
    assert all(head.startswith(b"GET /where?x=1 ") for head in seen)


async def test_changed_certificates_reach_new_connections_and_a_bad_change_none(
    pki: tuple[Path, Path],
) -> None:
    ca, certs = pki
    with sandbox_recording([]) as sandbox:
        async with stack({"s1": sandbox.port}, tls_listen="127.0.0.1:0", tls_dir=certs) as s:
            port = s.ingress.tls_address[1]
            assert s.ingress.certificates is not None
            assert not s.ingress.certificates.reload()  # nothing changed: nothing done
            # A new pair for a new host, and the default replaced.
            issue(ca, certs, "new.example.com")
            issue(ca, certs, "fallback2.example", "default")
            assert s.ingress.certificates.reload()
            cn, _ = await anyio.to_thread.run_sync(fetch, port, ca, "new.example.com")
            assert cn == "new.example.com"
            cn, _ = await anyio.to_thread.run_sync(fetch, port, ca, None)
            assert cn == "fallback2.example"
            # A key that does not match its certificate: logged, nothing changes.
            shutil.copy(certs / "shop.example.com.key", certs / "new.example.com.key")
            assert not s.ingress.certificates.reload()
            cn, _ = await anyio.to_thread.run_sync(fetch, port, ca, "new.example.com")
            assert cn == "new.example.com"


async def test_an_app_can_send_plain_http_to_https(pki: tuple[Path, Path]) -> None:
    _, certs = pki
    with sandbox_recording([]) as sandbox:
        async with stack(
            {"s1": sandbox.port}, tls_listen="127.0.0.1:0", tls_dir=certs, tls_redirect=["hello"]
        ) as s:
            answer = await s.client.get("/where", params={"x": "1"})
            port = s.ingress.tls_address[1]
            # A target that is no path is refused before it could become the Location's
            # authority: `https://hello.localhost:PORT*@evil.example/` leads to evil.example.
            plain = s.ingress.address[1]
            for target in (b"*@evil.example/phish", b"*", b"hello.localhost:80"):
                head = (
                    b"GET %s HTTP/1.1\r\nHost: hello.localhost\r\nConnection: close\r\n\r\n"
                    % target
                )
                refused = await anyio.to_thread.run_sync(talk, plain, head)
                assert refused.startswith(b"HTTP/1.1 400 "), (target, refused)
                assert b"\r\nlocation:" not in refused.lower(), refused
            async with httpx.AsyncClient(
                base_url=s.url, http1=False, http2=True, headers={"Host": "hello.localhost"}
            ) as h2c:  # h2 lets any visible :path through
                refused_h2 = await h2c.get(s.url + "/x", extensions={"target": b"@evil.example/"})
                assert refused_h2.status_code == 400, refused_h2.headers
                assert "location" not in refused_h2.headers
    assert answer.status_code == 308
    assert answer.headers["location"] == f"https://hello.localhost:{port}/where?x=1"


def _tls12_with(port: int, ca: Path, ciphers: str) -> tuple[str, str | None]:
    """(the suite and the ALPN protocol a TLS 1.2 client offering `ciphers` and h2 gets)."""
    context = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    context.check_hostname = False
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname="shop.example.com") as tls,
    ):
        suite = tls.cipher()
        assert suite is not None
        return suite[0], tls.selected_alpn_protocol()


async def test_tls12_offers_only_forward_secret_aead_suites(pki: tuple[Path, Path]) -> None:
    """RFC 9113 §9.2.2: none of Appendix A's suites (CBC, no forward secrecy) with h2; a
    client that offers only those gets no connection, not an h2 one on a suite it must not
    use."""
    ca, certs = pki
    async with stack({}, tls_listen="127.0.0.1:0", tls_dir=certs, http2=True) as s:
        port = s.ingress.tls_address[1]
        good = await anyio.to_thread.run_sync(
            _tls12_with, port, ca, "ECDHE-ECDSA-AES128-GCM-SHA256"
        )
        assert good == ("ECDHE-ECDSA-AES128-GCM-SHA256", "h2")
        for weak in ("ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA", "AES128-GCM-SHA256"):
            with pytest.raises(ssl.SSLError):
                await anyio.to_thread.run_sync(_tls12_with, port, ca, weak)


def handshake_fails(port: int, ca: Path) -> bool:
    """Whether a TLS handshake offering h2 and http/1.1 fails; none of the server's bytes may
    be HTTP/1.1's (an h2 client would read them as a broken preface)."""
    context = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    context.check_hostname = False
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="shop.example.com"):
                return False
        except (ssl.SSLError, ConnectionError):
            return True


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@contextlib.contextmanager
def tls_server(
    new_loop: Callable[[], asyncio.AbstractEventLoop], certs: Path, refused: list[str]
) -> Iterator[int]:
    """The HTTP server on TLS (`ingress.tls`'s certificates), two connections at most, on a
    loop of `new_loop` in a thread of its own (the ingress runs on uvloop; the tests' loop is
    asyncio's), answering 200; its port. `refused`: why it refused connections."""
    loop = new_loop()
    ports: list[int] = []
    ready = threading.Event()
    stop = asyncio.Event()

    async def answer(request: Request, out: Responder) -> None:
        out.send_whole(200, [], b"ok")

    async def main() -> None:
        context = Certificates(certs).context
        limits = Limits(max_connections=2)
        server = HttpServer(Handling(answer), limits, context, refused=refused.append)
        sock = bind_listener("127.0.0.1:0", 64, "test address")
        await server.start(sock, 64)
        ports.append(sock.getsockname()[1])
        ready.set()
        await stop.wait()
        await server.stop(1)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(30)
        yield ports[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        if not thread.is_alive():
            loop.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_handshake_under_way_counts_against_the_connection_bound(
    pki: tuple[Path, Path], loop: str
) -> None:
    """A TLS connection counts from its accept (`http1.tlsaccept`), not once its
    handshake is done: clients that never send a ClientHello hold at most `max_connections`;
    past it a new connection is closed at once, before any TLS (no HTTP/1.1 503 that a client
    whose ALPN chose h2 would read as a broken preface); when one of them goes, handshakes
    succeed again."""
    ca, certs = pki
    refused: list[str] = []
    with tls_server(LOOPS[loop], certs, refused) as port:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            assert handshake_fails(port, ca)
            assert refused == ["connections"]
            silent.pop().close()
            deadline = time.monotonic() + 20  # the server sees the client gone: its place
            while handshake_fails(port, ca):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            for each in silent:
                each.close()
        _, answer = fetch(port, ca, "shop.example.com")
        assert answer.startswith(b"HTTP/1.1 200 "), answer


@pytest.mark.parametrize("loop", LOOPS)
def test_stopping_closes_the_handshakes_under_way(pki: tuple[Path, Path], loop: str) -> None:
    """A stop cancels the handshakes under way: their connections close at once, not at the
    head's deadline (10 s here), and none is left open."""
    _, certs = pki
    refused: list[str] = []
    with tls_server(LOOPS[loop], certs, refused) as port:
        silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        time.sleep(0.2)  # accepted
    try:
        started = time.monotonic()
        for each in silent:
            with contextlib.suppress(ConnectionResetError):
                assert each.recv(1) == b""
        assert time.monotonic() - started < 5
    finally:
        for each in silent:
            each.close()


OUT_OF_DESCRIPTORS = """
import asyncio, os, resource, sys
from pathlib import Path
import uvloop
from wakeful.ingress.http1.server import Handling, HttpServer, Limits
from wakeful.ingress.ports import bind_listener
from wakeful.ingress.settings import IngressSettings
from wakeful.ingress.tls import Certificates

async def main() -> None:
    async def answer(request, out):
        out.send_whole(200, [], b"ok")

    context = Certificates(Path(sys.argv[1])).context
    server = HttpServer(Handling(answer), Limits(head_timeout=30), context)
    sock = bind_listener("127.0.0.1:0", 512, "test address")
    await server.start(sock, 512)
    room = len(os.listdir("/proc/self/fd")) + 30  # 30 descriptors to spare, no more
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    print(sock.getsockname()[1], flush=True)
    await asyncio.sleep(3600)

uvloop.run(main())
"""


def test_out_of_descriptors_a_queued_connection_is_told_at_once(pki: tuple[Path, Path]) -> None:
    """When silent TLS clients hold every descriptor, the connections queued behind them are
    accepted and closed at once (libuv's way for a plain listener), not left in the backlog
    to take each descriptor the moment one frees: a queue of them kept the plain listener
    from accepting anything until the attacker let go (a hostile tester's find)."""
    ca, certs = pki
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, str(certs)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
            try:
                time.sleep(0.5)  # accepted until there is no descriptor left
                with (
                    socket.create_connection(("127.0.0.1", port), timeout=3) as probe,
                    contextlib.suppress(ConnectionResetError),
                ):
                    assert probe.recv(1) == b""  # told at once, not a timeout
            finally:
                for each in silent:
                    each.close()
            deadline = time.monotonic() + 20  # their descriptors free: served again
            while handshake_fails(port, ca):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            server.kill()


def plain_http(port: int, request: bytes, *more: bytes) -> bytes:
    """What the server says to `request` sent as plain HTTP, then each of `more` 0.1 s apart
    (a body on a slow link), to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(request)
        for piece in more:
            time.sleep(0.1)
            raw.sendall(piece)  # a reset of the connection fails it here
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("loop", LOOPS)
def test_plain_http_on_the_tls_port_is_answered_400_with_the_reason(
    pki: tuple[Path, Path], loop: str
) -> None:
    """As nginx does (OpenSSL's reading of a request line in place of a record), where the
    handshake failed and closed without a word; a TLS client after them is served."""
    ca, certs = pki
    refused: list[str] = []
    with tls_server(LOOPS[loop], certs, refused) as port:
        for request in (
            (b"GET / HTTP/1.1\r\nHost: shop.example.com\r\n\r\n",),
            (b"DELETE /it HTTP/1.1\r\nHost: shop.example.com\r\n\r\n",),  # a method OpenSSL
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",),  # does not name, and h2c's preface
            (  # a body still coming after the answer: read until it ends (a lingering close)
                b"POST /form HTTP/1.1\r\nHost: shop.example.com\r\nContent-Length: 196608\r\n\r\n",
                *[b"x" * 65536] * 3,
            ),
        ):
            answer = plain_http(port, *request)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
            assert b"content-length: %d" % len(body) in head
            assert b"https://" in body
        assert refused == ["plain-http"] * 4
        _, answer = fetch(port, ca, "shop.example.com")
        assert answer.startswith(b"HTTP/1.1 200 "), answer


def closed_within(port: int, seconds: float) -> float:
    """Seconds until the server closes a connection that never sends a byte."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as raw:
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            assert raw.recv(1) == b""
        return time.monotonic() - started


@contextlib.asynccontextmanager
async def tls_ingress(certs: Path, **settings: Any) -> AsyncIterator[tuple[Stack, int]]:
    """A whole ingress (`stack`) with a TLS listener on `certs`, to a sandbox that answers
    200: the stack, and the TLS port."""
    with sandbox_recording([]) as sandbox:
        async with stack(
            {"s1": sandbox.port}, tls_listen="127.0.0.1:0", tls_dir=certs, **settings
        ) as s:
            yield s, s.ingress.tls_address[1]


async def test_a_handshake_that_never_starts_is_closed_at_the_heads_deadline(
    pki: tuple[Path, Path],
) -> None:
    ca, certs = pki
    async with tls_ingress(certs, client_header_timeout=0.5) as (s, port):
        assert 0.4 < await anyio.to_thread.run_sync(closed_within, port, 20) < 10
        assert s.sample("connections_refused_total", reason="tls-handshake") == 1
        _, answer = await anyio.to_thread.run_sync(fetch, port, ca, "shop.example.com")
        assert answer.startswith(b"HTTP/1.1 200 "), answer


async def test_the_ingress_counts_plain_http_on_its_tls_port(pki: tuple[Path, Path]) -> None:
    _, certs = pki
    async with tls_ingress(certs) as (s, port):
        request = b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n"
        answer = await anyio.to_thread.run_sync(plain_http, port, request)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert s.sample("connections_refused_total", reason="plain-http") == 1


async def test_the_duplicates_kept_for_plain_http_are_bounded(pki: tuple[Path, Path]) -> None:
    """Each handshake under way keeps a duplicate of its connection for the 400, up to
    `SPARES`: clients that never finish a handshake hold no more descriptors than that beyond
    the connection bound; past it a plain HTTP request is closed without a word."""
    _, certs = pki
    request = b"GET / HTTP/1.1\r\nHost: hello.localhost\r\n\r\n"
    async with tls_ingress(certs, client_header_timeout=60) as (_, port):
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(SPARES)]
        try:
            with anyio.fail_after(20):
                while await anyio.to_thread.run_sync(plain_http, port, request):  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # until every silent one holds its duplicate
        finally:
            for each in silent:
                each.close()
        with anyio.fail_after(20):  # their places free, the 400 again
            while not await anyio.to_thread.run_sync(plain_http, port, request):  # noqa: ASYNC110
                await anyio.sleep(0.05)
