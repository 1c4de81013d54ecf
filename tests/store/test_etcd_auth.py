"""etcd users and roles per piece (`wakeful etcd-auth`, wakeful/store/etcd_auth.py) on a real
etcd that serves mutual TLS only, with certificates made by the README's own commands.

The command refuses any certificate but root's; then each piece's certificate reaches only its
own key ranges (a node cannot touch an app's spec or the tokens, an ingress writes only its
own record among the tunnel replicas', a certificate that names no user gets nothing), running
it again changes nothing, and the real
pieces, each with its own certificate, deploy and serve an app.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from pydantic import BaseModel

from tests.support.cluster import deploy, start_cluster
from tests.support.notes import HOST as NOTES_HOST
from tests.support.notes import add, notes_app, read
from tests.support.pki import BOUND, Pki, environment, make_pki, readme_commands
from tests.support.up import WAKEFUL
from wakeful.domain import keys
from wakeful.domain.models import AppState
from wakeful.store import StoreError, TLSFiles, open_store
from wakeful.store.etcd_auth import INGRESS, NODE, PIECES, READ, Grant, sealed_readers
from wakeful.store.testing import EtcdServer

pytestmark = pytest.mark.anyio
NAMESPACE = "/authns/"
PIECE_STEP = "**A user and a role per piece.**"
"""The README step whose `sh` block makes a certificate per piece."""


class Thing(BaseModel):
    n: int


def certificate(pki: Pki, name: str) -> TLSFiles:
    return TLSFiles(ca=pki.ca, cert=pki.dir / f"{name}.crt", key=pki.dir / f"{name}.key")


def etcd_auth(server: EtcdServer, tls: TLSFiles) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **environment(server, tls), "WAKEFUL_STORE_NAMESPACE": NAMESPACE}
    return subprocess.run(
        [*WAKEFUL, "etcd-auth"], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    made = make_pki(tmp_path_factory.mktemp("auth") / "pki")
    done = subprocess.run(
        ["sh", "-ec", readme_commands(PIECE_STEP)], cwd=made.dir, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return made


@pytest.fixture(scope="module")
def auth_etcd(pki: Pki) -> Iterator[EtcdServer]:
    """A real etcd on mutual TLS whose authentication `wakeful etcd-auth` turned on (refusing,
    first, a certificate that is not root's)."""
    with EtcdServer(tls=pki.server()) as server:
        refused = etcd_auth(server, certificate(pki, "wakeful-node"))
        assert refused.returncode == 2
        assert "is for 'wakeful-node', not 'root'" in refused.stderr, refused.stderr
        enabled = etcd_auth(server, certificate(pki, "root"))
        assert enabled.returncode == 0, enabled.stderr
        assert "authentication: enabled" in enabled.stdout
        yield server


async def outcome(server: EtcdServer, tls: TLSFiles, operation: str) -> str:
    """ "ok" or "denied": one store call with `tls`'s certificate under the namespace."""
    kind, _, key = operation.partition(" ")
    try:
        with anyio.fail_after(BOUND):
            async with open_store(server.url, namespace=NAMESPACE, tls=tls) as store:
                if kind == "put":
                    await store.put(key, Thing(n=1))
                elif kind == "list":
                    await store.list(key, Thing)
                else:
                    await store.get(key, Thing)
    except StoreError as exc:
        refusal = ("permission denied", "user name not found", "PERMISSION_DENIED")
        return "denied" if any(text in str(exc) for text in refusal) else f"error: {exc}"
    return "ok"


EXPECTED = {
    "wakeful-control": {"put apps/a": "ok", "put tokens/t": "ok", "list tokens/": "ok"},
    "wakeful-node": {
        "put sandboxes/s": "ok",
        "put nodes/n": "ok",
        "put cordons/n": "ok",
        "get pools/p": "ok",
        "get versions/a/v1": "ok",
        "get states/a": "ok",
        # A state goes back through the control API, which checks its holder (invariant 21).
        "put states/a": "denied",
        "put apps/a": "denied",
        "put pools/p": "denied",
        "put versions/a/v1": "denied",
        "put tokens/t": "denied",
        "list tokens/": "denied",
        "get apps/a": "denied",
        # Sealed records: the control plane's alone (`etcd_auth.SEALED`).
        "list secrets/": "denied",
        "get registries/registry.example.com": "denied",
        "list registries/": "denied",
        "list certs/": "denied",
        "list acme/keys/": "denied",
    },
    "wakeful-ingress": {
        "get apps/a": "ok",
        "list sandboxes/": "ok",
        "list tokens/": "ok",
        "list nodes/": "ok",
        "put ingresses/r": "ok",
        "put sandboxes/s": "denied",
        "put apps/a": "denied",
        "put tokens/t": "denied",
        "put nodes/n": "denied",
        "get pools/p": "denied",
        "list registries/": "denied",
        # Certificates from ACME: the challenges and the certificates, never their keys.
        "list acme/challenges/": "ok",
        "get certs/shop.test": "ok",
        "list certs/": "ok",
        "list acme/keys/": "denied",
        "get acme/account": "denied",
        "put certs/shop.test": "denied",
    },
    "wakeful": {"get apps/a": "denied"},  # step 1's certificate: no such user
}


@pytest.mark.parametrize("user", list(EXPECTED))
async def test_each_certificate_reaches_only_its_own_keys(
    auth_etcd: EtcdServer, pki: Pki, user: str
) -> None:
    tls = certificate(pki, user) if user != "wakeful" else pki.client()
    found = {op: await outcome(auth_etcd, tls, op) for op in EXPECTED[user]}
    assert found == EXPECTED[user]


def test_no_role_but_the_control_planes_reaches_a_sealed_record() -> None:
    """Apps' secrets, registries' logins, the current key's id, ACME's keys: a grant that
    reaches one from a node's or an ingress's role is found (and `enable_auth` refuses to
    apply it)."""
    assert sealed_readers() == []
    wider = dict(PIECES)
    wider[NODE] = (*PIECES[NODE], Grant(keys.REGISTRIES, READ))
    wider[INGRESS] = (*PIECES[INGRESS], Grant("", READ))
    assert sealed_readers(wider) == [
        f"{NODE}: {keys.REGISTRIES}",
        f"{INGRESS}: {keys.SECRETS}",
        f"{INGRESS}: {keys.REGISTRIES}",
        f"{INGRESS}: {keys.SECRETS_KEY}",
        f"{INGRESS}: {keys.ACME_KEYS}",
        f"{INGRESS}: {keys.ACME_ACCOUNT}",
    ]


def test_running_it_again_changes_nothing(auth_etcd: EtcdServer, pki: Pki) -> None:
    again = etcd_auth(auth_etcd, certificate(pki, "root"))
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the node isolates its sandboxes as root")
def test_the_pieces_serve_an_app_each_with_its_own_certificate(
    auth_etcd: EtcdServer, pki: Pki, tmp_path: Path
) -> None:
    def variables(user: str) -> dict[str, str]:
        files = environment(auth_etcd, certificate(pki, user))
        return {**files, "WAKEFUL_STORE_NAMESPACE": NAMESPACE}

    role_env = {
        "activator": {**variables("wakeful-control"), "WAKEFUL_IDLE_INTERVAL": "1"},
        "node": variables("wakeful-node"),
        "ingress": variables("wakeful-ingress"),
    }
    with start_cluster(auth_etcd.url, tmp_path, nodes=("n1",), role_env=role_env) as cluster:
        api, proxy, env = cluster
        assert "live" in deploy(api, env).stdout
        answer = httpx.get(f"{proxy}/", headers={"Host": "hello.localhost"}, timeout=60)
        assert answer.status_code == 200, answer.text
        # A stateful app scaled to zero and woken again: its node, which cannot write
        # states/, handed its state back through the control API.
        deploy(api, env, notes_app(tmp_path, delay="5s"))
        with httpx.Client(base_url=proxy, timeout=60) as client:
            add(client, "kept across scale-to-zero")
            first = client.get("/", headers=NOTES_HOST).headers["x-instance"]
            control = certificate(pki, "wakeful-control")
            deadline = time.monotonic() + 60
            while (released := state_of(auth_etcd, control)).node is not None:
                assert time.monotonic() < deadline, released
                time.sleep(0.2)
            assert released.released_by == "n1" and released.archive, released
            assert read(client) == ["kept across scale-to-zero"]
            assert client.get("/", headers=NOTES_HOST).headers["x-instance"] != first


def state_of(server: EtcdServer, tls: TLSFiles) -> AppState:
    """The notes app's state record (`states/notes`), read with the control plane's
    certificate (on a thread of its own: this test's thread has an event loop already)."""

    async def read() -> AppState | None:
        async with open_store(server.url, namespace=NAMESPACE, tls=tls) as store:
            found = await store.get(keys.state("notes"), AppState)
        return None if found is None else found.value

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        found = thread.submit(anyio.run, read).result(timeout=BOUND * 2)
    assert found is not None
    return found
