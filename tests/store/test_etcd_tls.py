"""etcd over mutual TLS, against a real etcd that serves https only and requires client
certificates (`--client-cert-auth`), with certificates made by the README's own commands.

The store with the right CA and client certificate reads, writes and watches; without a
client certificate, with one from another CA, or without TLS at all it fails at once with a
`StoreError` that says what to check; and the `WAKEFUL_ETCD_*` variables reach the store
through the real `wakeful` command.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest
from pydantic import BaseModel

from tests.support.pki import BOUND, Pki, environment, make_pki
from wakeful.store import Event, StoreError, TLSConfigError, TLSFiles, Unavailable, open_store
from wakeful.store.settings import StoreSettings
from wakeful.store.testing import EtcdServer

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("tls") / "ours")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The same commands again: another CA, whose client certificate etcd must refuse."""
    return make_pki(tmp_path_factory.mktemp("tls") / "theirs")


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[EtcdServer]:
    """A real etcd on a free loopback port and a temporary data dir, https only, requiring
    client certificates signed by `pki`'s CA; stopped by its pid at the end."""
    with EtcdServer(tls=pki.server()) as server:
        yield server


async def test_with_the_ca_and_a_client_certificate_the_store_puts_gets_and_watches(
    tls_etcd: EtcdServer, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in environment(tls_etcd, pki.client()).items():
        monkeypatch.setenv(name, value)
    settings = StoreSettings(store_namespace="/mtls/")
    with anyio.fail_after(BOUND):
        async with settings.open_store() as store:
            first = await store.put("c/a", Counter(n=1))
            found = await store.get("c/a", Counter)
            assert found is not None and (found.value.n, found.revision) == (1, first)
            stream = store.watch("c/", first + 1)
            second = await store.put("c/b", Counter(n=2))
            event = await stream.__anext__()
            await stream.aclose()  # type: ignore[attr-defined]
    assert isinstance(event, Event)
    assert (event.key, event.revision, event.decode(Counter).n) == ("c/b", second, 2)


async def refused(url: str, tls: TLSFiles) -> str:
    """Open the store and make one call; it must fail, within `BOUND`, with `Unavailable` (a
    `StoreError`: the pieces' own handling applies). Its message, as text."""
    with pytest.raises(StoreError) as raised, anyio.fail_after(BOUND):
        async with open_store(url, namespace="/refused/", tls=tls) as store:
            await store.get("c/a", Counter)
    assert isinstance(raised.value, Unavailable), raised.value
    return str(raised.value)


async def test_without_a_client_certificate_etcd_refuses_the_store(
    tls_etcd: EtcdServer, pki: Pki
) -> None:
    message = await refused(tls_etcd.url, TLSFiles(ca=pki.ca))
    assert "etcd connect" in message
    assert "WAKEFUL_ETCD_CERT and WAKEFUL_ETCD_KEY" in message, message


async def test_a_client_certificate_from_another_ca_is_refused(
    tls_etcd: EtcdServer, pki: Pki, other_pki: Pki
) -> None:
    message = await refused(tls_etcd.url, other_pki.client(ca=pki))
    assert "etcd connect" in message
    assert "--trusted-ca-file signed WAKEFUL_ETCD_CERT" in message, message


async def test_a_server_certificate_from_another_ca_is_refused(
    tls_etcd: EtcdServer, pki: Pki, other_pki: Pki
) -> None:
    message = await refused(tls_etcd.url, pki.client(ca=other_pki))
    assert "CERTIFICATE_VERIFY_FAILED" in message, message


async def test_without_tls_the_store_fails_and_says_to_set_the_ca(tls_etcd: EtcdServer) -> None:
    message = await refused(tls_etcd.url, TLSFiles())
    assert "set WAKEFUL_ETCD_CA" in message, message


async def test_several_endpoints_over_tls_need_a_server_name(
    tls_etcd: EtcdServer, pki: Pki
) -> None:
    twice = f"etcd://{tls_etcd.endpoint},{tls_etcd.endpoint}"
    with pytest.raises(TLSConfigError, match="needs WAKEFUL_ETCD_SERVER_NAME"):
        async with open_store(twice, tls=pki.client()):
            pass
    named = dataclasses.replace(pki.client(), server_name="localhost")
    with anyio.fail_after(BOUND):
        async with open_store(twice, namespace="/named/", tls=named) as store:
            revision = await store.put("c/a", Counter(n=3))
            assert await store.get("c/a", Counter) is not None
    assert revision > 0


def wakeful(env: dict[str, str]) -> subprocess.Popen[str]:
    """`wakeful idle-monitor` (the smallest piece that opens the store) in a process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    return subprocess.Popen(
        [sys.executable, "-m", "wakeful.cli", "idle-monitor"],
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(env: dict[str, str]) -> tuple[int, str]:
    process = wakeful(env)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stderr


def test_the_wakeful_command_runs_over_mutual_tls_from_its_environment(
    tls_etcd: EtcdServer, pki: Pki
) -> None:
    process = wakeful(environment(tls_etcd, pki.client()))
    try:
        assert process.stdout is not None
        started = process.stdout.readline()  # printed once the store has answered
        process.send_signal(signal.SIGTERM)  # maybe before its handler is in place
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert started.startswith("idle monitor: every"), stderr
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "WARNING" not in stderr, stderr  # loopback, and a client certificate anyway


@pytest.mark.parametrize(
    ("files", "status", "says"),
    [
        ({"WAKEFUL_ETCD_CA": "ca.crt", "WAKEFUL_ETCD_CERT": "wakeful.crt"}, 2,
         "WAKEFUL_ETCD_CERT is set but WAKEFUL_ETCD_KEY is not"),
        ({"WAKEFUL_ETCD_CA": "ca.crt", "WAKEFUL_ETCD_KEY": "wakeful.key"}, 2,
         "WAKEFUL_ETCD_KEY is set but WAKEFUL_ETCD_CERT is not"),
        ({"WAKEFUL_ETCD_CA": "absent.crt"}, 2, "WAKEFUL_ETCD_CA: {dir}/absent.crt does not exist"),
        ({"WAKEFUL_ETCD_CA": "ca.crt"}, 1, "set WAKEFUL_ETCD_CERT and WAKEFUL_ETCD_KEY"),
    ],
    ids=["cert-without-key", "key-without-cert", "missing-file", "refused-handshake"],
)  # fmt: skip
def test_the_wakeful_command_reports_bad_tls_in_one_line(
    tls_etcd: EtcdServer, pki: Pki, files: dict[str, str], status: int, says: str
) -> None:
    env = {name: str(pki.dir / file) for name, file in files.items()}
    code, stderr = finished({"WAKEFUL_STORE_URL": tls_etcd.url, **env})
    assert code == status, stderr
    assert "Traceback" not in stderr, stderr
    line = next(line for line in stderr.splitlines() if line.startswith("wakeful: error: "))
    assert says.format(dir=pki.dir) in line, stderr
