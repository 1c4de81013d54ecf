"""How the ingress's TLS configuration is refused or warned of (`ingress.tls`): a directory
that cannot serve is named with the file and the reason (OpenSSL's own words, `[SSL] PEM
lib`, name none), a key OpenSSL would wait on is refused at once, certificates with no
listener are warned of, and the start line names the HTTPS listener."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.certs import ingress_pki, openssl
from tests.support.ingress import stack
from wakeful.ingress.settings import IngressSettings
from wakeful.ingress.tls import Certificates, TLSConfigError

pytestmark = pytest.mark.anyio


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, Path]:
    """(the CA's directory, the ingress's certificate directory)."""
    return ingress_pki(tmp_path)


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


async def test_certificates_without_a_tls_listener_are_warned_of(
    pki: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """WAKEFUL_TLS_DIR alone serves nothing: it was ignored without a word."""
    _, certs = pki
    async with stack({}, tls_dir=certs):
        pass
    assert (
        f"WAKEFUL_TLS_LISTEN is not: there is no HTTPS listener, and the certificates in {certs}"
        in caplog.text
    )
    caplog.clear()
    async with stack({}, tls_listen="127.0.0.1:0", tls_dir=certs):
        pass
    async with stack({}, tls_dir=certs, ingress_worker=1):  # the first worker says it
        pass
    assert "WAKEFUL_TLS_LISTEN is not" not in caplog.text


@pytest.mark.parametrize(
    ("tls_listen", "line"),
    [
        (None, "ingress listening on http://127.0.0.1:80"),
        ("0.0.0.0:443", "ingress listening on http://127.0.0.1:80 and https://0.0.0.0:443"),
    ],
)
def test_the_start_line_names_the_https_listener(tls_listen: str | None, line: str) -> None:
    assert IngressSettings().listening("127.0.0.1:80", tls_listen) == line


def _fifo(key: Path) -> None:
    key.unlink()
    os.mkfifo(key)


def _encrypted(key: Path) -> None:
    plain = key.with_suffix(".plain")
    key.rename(plain)
    openssl(
        "pkey", "-in", plain.name, "-aes256", "-passout", "pass:x", "-out", key.name, cwd=key.parent
    )
    plain.unlink()


@pytest.mark.parametrize(
    ("change", "said"),
    [(_fifo, "shop.example.com.key is not a regular file"), (_encrypted, "the key is encrypted")],
)
def test_a_key_openssl_would_wait_on_is_refused_at_once(
    pki: tuple[Path, Path], change: Callable[[Path], None], said: str
) -> None:
    """A FIFO (or a device) in the directory would block OpenSSL's read, and an encrypted key
    its prompt for a passphrase: the reload's thread hung for good, and shutdown with it."""
    _, certs = pki
    change(certs / "shop.example.com.key")
    raised: list[BaseException] = []

    def load() -> None:
        try:
            Certificates(certs)
        except BaseException as exc:  # looked at below
            raised.append(exc)

    thread = threading.Thread(target=load, daemon=True)  # a hang fails the test, not the run
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "loading the directory hangs"
    [exc] = raised
    assert isinstance(exc, TLSConfigError) and said in str(exc), exc


def _not_pem(cert: Path) -> Path:
    cert.write_text("not a certificate\n")
    return cert.parent


def _cut(cert: Path) -> Path:
    cert.write_bytes(cert.read_bytes()[:300])
    return cert.parent


def _key_not_pem(cert: Path) -> Path:
    cert.with_suffix(".key").write_text("-----BEGIN PRIVATE KEY-----\nnope\n")
    return cert.parent


def _another_key(cert: Path) -> Path:
    openssl("genpkey", "-algorithm", "ed25519", "-out", "default.key", cwd=cert.parent)
    return cert.parent


def _no_directory(cert: Path) -> Path:
    return cert.parent / "nosuch"


def _a_file(cert: Path) -> Path:
    return cert


@pytest.mark.parametrize(
    ("change", "said"),
    [
        pytest.param(_not_pem, "default.crt holds no PEM certificate", id="not PEM"),
        pytest.param(_cut, "default.crt holds no PEM certificate", id="cut short"),
        pytest.param(_key_not_pem, "default.key is not a PEM private key", id="key not PEM"),
        pytest.param(
            _another_key,
            "default.key is not the key of the certificate in default.crt",
            id="another key",
        ),
        pytest.param(_no_directory, "nosuch does not exist", id="no directory"),
        pytest.param(_a_file, "default.crt is not a directory", id="a file"),
    ],
)
def test_a_directory_that_cannot_serve_is_named_with_the_reason(
    pki: tuple[Path, Path], change: Callable[[Path], Path], said: str
) -> None:
    """OpenSSL's own words for a file that is not PEM (`[SSL] PEM lib`) name no file, and a
    directory that is not there was "no default.crt"."""
    _, certs = pki
    with pytest.raises(TLSConfigError) as refused:
        Certificates(change(certs / "default.crt"))
    assert said in str(refused.value)
    assert "PEM lib" not in str(refused.value)
