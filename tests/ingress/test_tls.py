"""TLS on the ingress (`ingress.tls`), with a CA and certificates made by openssl in the test:
the certificate is chosen by SNI (exact, wildcard, default); a request over TLS is routed by its
Host and reaches the sandbox marked https; changed files are served to new connections without
a restart, and a bad change leaves the certificates in use; an app can send plain HTTP to
HTTPS; a directory that cannot serve stops the start, naming it."""

from __future__ import annotations

import shutil
import socket
import ssl
from pathlib import Path

import anyio
import pytest

from tests.support.certs import ingress_pki, issue
from tests.support.ingress import RawServer, read_head, stack

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
    assert answer.status_code == 308
    assert answer.headers["location"] == f"https://hello.localhost:{port}/where?x=1"


async def test_a_directory_without_a_default_stops_the_start_naming_it(
    pki: tuple[Path, Path],
) -> None:
    _, certs = pki
    (certs / "default.crt").unlink()
    with pytest.raises(BaseException) as raised:  # noqa: PT011 - unwrapped below
        async with stack({}, tls_listen="127.0.0.1:0", tls_dir=certs):
            pass
    cause = raised.value
    while isinstance(cause, BaseExceptionGroup):  # out of the ingress's task groups
        cause = cause.exceptions[0]
    assert isinstance(cause, OSError), cause
    assert "no default.crt and default.key" in str(cause) and cause.filename == str(certs)
