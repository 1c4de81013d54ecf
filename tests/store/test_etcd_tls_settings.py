"""The etcd TLS settings, checked before any connection, and the warning about an etcd that
is reached off this machine without a client certificate. The etcd here is the session's
plaintext one, or an address nothing answers at; tests/store/test_etcd_tls.py has the etcd
that serves mutual TLS."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from wakeful.domain.models import describe_validation_error
from wakeful.store import StoreError, TLSConfigError, TLSFiles, Unavailable, open_store
from wakeful.store.settings import StoreSettings
from wakeful.store.testing import EtcdServer
from wakeful.store.tls import exposure_warning, is_loopback

pytestmark = pytest.mark.anyio

NOWHERE = "192.0.2.1:2379"  # TEST-NET-1 (RFC 5737): never routed, so never an etcd
CERT_PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY_PEM = b"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
WARNED = "can rewrite an app's command; use mutual TLS (WAKEFUL_ETCD_CA/CERT/KEY)"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("10.0.0.5", False),
        ("192.168.1.2", False),
        ("0.0.0.0", False),
        ("::", False),
        ("fe80::1", False),
        ("128.0.0.1", False),
        ("etcd.internal", False),
        ("localhost.example.com", False),
    ],
)
def test_only_loopback_addresses_and_localhost_count_as_this_machine(
    host: str, loopback: bool
) -> None:
    assert is_loopback(host) is loopback


FULL = TLSFiles(Path("ca.crt"), Path("c.crt"), Path("c.key"))


@pytest.mark.parametrize(
    ("endpoints", "tls", "warned_about"),
    [
        (["127.0.0.1:2379"], TLSFiles(), None),
        (["localhost:2379", "127.0.0.2:2379"], TLSFiles(), None),
        (["[::1]:2379"], TLSFiles(), None),
        (["10.0.0.5:2379"], TLSFiles(), "10.0.0.5:2379"),
        (["127.0.0.1:2379", "10.0.0.6:2379"], TLSFiles(), "10.0.0.6:2379"),
        (["10.0.0.5:2379", "10.0.0.6:2379"], TLSFiles(), "10.0.0.5:2379, 10.0.0.6:2379"),
        (["10.0.0.5:2379"], TLSFiles(ca=Path("ca.crt")), "10.0.0.5:2379"),  # server TLS only
        (["10.0.0.5:2379"], FULL, None),
        (["10.0.0.5:2379", "10.0.0.6:2379"], FULL, None),
        (["127.0.0.1:2379"], FULL, None),
    ],
)
def test_a_warning_only_for_an_etcd_off_this_machine_without_a_client_certificate(
    endpoints: list[str], tls: TLSFiles, warned_about: str | None
) -> None:
    warning = exposure_warning(endpoints, tls)
    if warned_about is None:
        assert warning is None
    else:
        assert warning is not None
        assert f"anyone who can reach etcd at {warned_about} {WARNED}" in warning


def store_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("wakeful.store")]


async def opened_or_not(url: str, tls: TLSFiles | None = None) -> None:
    """Open the store at `url` and close it; an address nothing answers at fails (bounded)."""
    with anyio.fail_after(30):
        try:
            async with open_store(url, namespace="/warn/", tls=tls):
                pass
        except Unavailable:
            pass


async def test_opening_an_etcd_store_off_this_machine_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    await opened_or_not(f"etcd://{NOWHERE},192.0.2.2:2379")
    [record] = store_warnings(caplog)
    assert record.levelno == logging.WARNING
    assert f"at {NOWHERE}, 192.0.2.2:2379 {WARNED}" in record.getMessage()


async def test_a_loopback_etcd_and_a_client_certificate_open_without_a_warning(
    caplog: pytest.LogCaptureFixture, etcd_server: EtcdServer, pem: dict[str, Path]
) -> None:
    caplog.set_level(logging.WARNING)
    await opened_or_not(etcd_server.url)
    await opened_or_not(f"etcd://localhost:{etcd_server.client_port}")
    await opened_or_not(f"etcd://{NOWHERE}", TLSFiles(pem["ca"], pem["cert"], pem["key"]))
    assert store_warnings(caplog) == []


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, Path]:
    """Files that look like what each setting needs (the checks read no further)."""
    files = {"ca": CERT_PEM, "cert": CERT_PEM, "key": KEY_PEM}
    for name, data in files.items():
        (tmp_path / f"{name}.pem").write_bytes(data)
    return {name: tmp_path / f"{name}.pem" for name in files}


def refusal(tmp_path: Path, pem: dict[str, Path], **files: str) -> str:
    """The one-line error `StoreSettings` gives for these `etcd_*` files on an etcd URL;
    'ca', 'cert', 'key' name the good files, anything else a path under tmp_path."""
    chosen = {f"etcd_{k}": pem.get(v) or tmp_path / v for k, v in files.items()}
    with pytest.raises(ValidationError) as raised:
        StoreSettings(store_url=f"etcd://{NOWHERE}", **chosen)  # type: ignore[arg-type]
    return describe_validation_error(raised.value)


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"ca": "ca", "cert": "cert"},
         "WAKEFUL_ETCD_CERT is set but WAKEFUL_ETCD_KEY is not: a client certificate needs "
         "both WAKEFUL_ETCD_CERT (the certificate) and WAKEFUL_ETCD_KEY (its private key)"),
        ({"ca": "ca", "key": "key"}, "WAKEFUL_ETCD_KEY is set but WAKEFUL_ETCD_CERT is not"),
        ({"cert": "cert"}, "WAKEFUL_ETCD_CERT is set but WAKEFUL_ETCD_KEY is not"),
        ({"cert": "cert", "key": "key"},
         "WAKEFUL_ETCD_CERT and WAKEFUL_ETCD_KEY are set but WAKEFUL_ETCD_CA is not"),
        ({"ca": "absent.pem"}, "WAKEFUL_ETCD_CA: {tmp}/absent.pem does not exist"),
        ({"ca": "ca", "cert": "gone.crt", "key": "key"},
         "WAKEFUL_ETCD_CERT: {tmp}/gone.crt does not exist"),
        ({"ca": "ca", "cert": "cert", "key": "nokey.pem"},
         "WAKEFUL_ETCD_KEY: {tmp}/nokey.pem does not exist"),
        ({"ca": "ca", "cert": "key", "key": "cert"},
         "WAKEFUL_ETCD_CERT: {tmp}/key.pem does not hold a PEM certificate"),
        ({"ca": "."}, "WAKEFUL_ETCD_CA: {tmp} cannot be read: Is a directory"),
    ],
    ids=["cert-no-key", "key-no-cert", "cert-alone", "no-ca", "no-ca-file", "no-cert-file",
         "no-key-file", "swapped", "a-directory"],
)  # fmt: skip
def test_tls_settings_that_cannot_work_are_refused_naming_the_settings(
    tmp_path: Path, pem: dict[str, Path], files: dict[str, str], says: str
) -> None:
    message = refusal(tmp_path, pem, **files)
    assert says.format(tmp=tmp_path) in message
    assert "Value error" not in message and "Traceback" not in message


def test_relative_tls_paths_are_resolved_once_at_start(
    tmp_path: Path, pem: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WAKEFUL_STORE_URL", f"etcd://{NOWHERE}")
    monkeypatch.setenv("WAKEFUL_ETCD_CA", "ca.pem")
    monkeypatch.setenv("WAKEFUL_ETCD_CERT", "cert.pem")
    monkeypatch.setenv("WAKEFUL_ETCD_KEY", "key.pem")
    monkeypatch.setenv("WAKEFUL_ETCD_SERVER_NAME", "etcd.internal")
    tls = StoreSettings().tls
    assert tls == TLSFiles(pem["ca"], pem["cert"], pem["key"], server_name="etcd.internal")


def test_other_stores_ignore_the_etcd_tls_settings(tmp_path: Path) -> None:
    settings = StoreSettings(store_url="memory://", etcd_cert=tmp_path / "absent.crt")
    assert settings.etcd_cert == tmp_path / "absent.crt"


async def test_the_store_layer_checks_the_files_itself_before_connecting(
    tmp_path: Path, pem: dict[str, Path]
) -> None:
    """`open_store` called directly (not through the settings) refuses the same way."""
    with pytest.raises(TLSConfigError, match="WAKEFUL_ETCD_KEY is set but WAKEFUL_ETCD_CERT"):
        async with open_store(f"etcd://{NOWHERE}", tls=TLSFiles(pem["ca"], key=pem["key"])):
            pass
    with pytest.raises(TLSConfigError, match=f"WAKEFUL_ETCD_CA: {tmp_path}/x.pem does not"):
        async with open_store(f"etcd://{NOWHERE}", tls=TLSFiles(tmp_path / "x.pem")):
            pass


def test_half_a_client_certificate_never_reaches_grpc_which_would_abort_the_process(
    etcd_server: EtcdServer,
) -> None:
    """grpc's C core aborts the whole process (SIGABRT) on a key without its chain or the
    reverse; `EtcdStore` refuses both first. In a child process, in case it does not."""
    script = textwrap.dedent(
        f"""
        import asyncio
        from wakeful.store import TLSConfigError
        from wakeful.store.etcd import EtcdStore

        async def main():
            for half in ({{"cert_key": {KEY_PEM!r}}}, {{"cert_chain": {CERT_PEM!r}}}):
                try:
                    store = EtcdStore([{etcd_server.endpoint!r}], ca_cert={CERT_PEM!r}, **half)
                    await store.connect()
                except TLSConfigError as exc:
                    print("refused:", exc)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("refused: a client certificate needs both") == 2, done.stdout


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word, as a hung etcd would."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


async def test_an_etcd_that_never_answers_is_unavailable_within_the_timeout(
    silent_port: int,
) -> None:
    with pytest.raises(StoreError) as raised, anyio.fail_after(30):
        async with open_store(f"etcd://127.0.0.1:{silent_port}"):
            pass
    assert isinstance(raised.value, Unavailable)
    assert "etcd connect: no answer in time" in str(raised.value)
