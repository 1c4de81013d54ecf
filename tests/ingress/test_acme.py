"""What an ingress does for certificates from ACME (`ingress.acme`, `ingress.tls`): it answers
the HTTP-01 challenges in the store on its plain listener before routing, and serves the
certificates the control plane hands it, from memory, to the next handshake; with no
certificate directory a name with none gets a clean `unrecognized_name` alert, and a file
certificate wins over ACME's for its name."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from pathlib import Path

import anyio
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from tests.ingress.test_tls import sandbox_recording
from tests.support.certs import issue, openssl
from tests.support.ingress import stack
from tests.support.waiting import eventually
from wakeful.domain import keys
from wakeful.domain.models import AcmeChallenge, CertRecord, CertState, Issued
from wakeful.ingress.acme import LOOKUP_GAP, LOOKUP_SECONDS, Challenges, ServedPair
from wakeful.ingress.server import Ingress
from wakeful.ingress.tls import Certificates
from wakeful.store import open_store
from wakeful.store.testing import EtcdServer

pytestmark = pytest.mark.anyio

REFUSED = "UNRECOGNIZED_NAME|UNEXPECTED_EOF"
"""The handshake refused: OpenSSL's `unrecognized_name` alert, which asyncio's transport may
close the connection before sending (the client then sees it end)."""
TOKEN = "tK3n_Ab-9xYz0123456789abcdef"
SEALED = "v1:0123456789ab:" + "A" * 64
PATH = b"/.well-known/acme-challenge/"
MADE_UP = (b"short", b"../../apps/hello", b"a/b" * 10, b"%2e%2e" * 5, b"x" * 129)
"""Targets under the challenge path that are no ACME token: never read from the store."""


class Handed:
    """The control plane's side of `CertSource`, as a test sets it."""

    def __init__(self) -> None:
        self.pairs: list[ServedPair] = []
        self.calls = 0

    async def served(self) -> list[ServedPair]:
        self.calls += 1
        return list(self.pairs)


def make_ca(where: Path, name: str) -> Path:
    where.mkdir()
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", f"/CN={name}", cwd=where,
    )  # fmt: skip
    return where


def served_by(port: int, sni: str) -> str:
    """The issuer's CN of the certificate served for `sni` (the chain is not checked here);
    `ssl.SSLError` when the handshake fails."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=sni) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    issuer = x509.load_der_x509_certificate(der).issuer
    return str(issuer.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def installed(ingress: Ingress) -> dict[str, str]:
    return {} if ingress.issued is None else ingress.issued.installed


def record(name: str, serial: str) -> CertRecord:
    issued = Issued(chain="-", not_before=0, not_after=2e9, issuer="CN=x", serial=serial)
    return CertRecord(name=name, state=CertState.VALID, issued=issued)


async def test_a_challenge_is_answered_on_the_plain_listener_before_routing() -> None:
    """Before any redirect to HTTPS too: every app's plain requests are sent there here."""
    with sandbox_recording([]) as sandbox:
        async with stack({"s1": sandbox.port}, tls_listen="127.0.0.1:0", tls_redirect=["*"]) as s:
            challenge = AcmeChallenge(
                token=TOKEN, key_authorization=f"{TOKEN}.thumb", name="x.test"
            )
            await s.store.put(keys.challenge(TOKEN), challenge)
            path = f"/.well-known/acme-challenge/{TOKEN}"
            await eventually(lambda: TOKEN.encode() in s.ingress.challenges)
            answer = await s.client.get(path, headers={"Host": "hello.localhost"})
            assert answer.status_code == 200 and answer.text == f"{TOKEN}.thumb"
            assert answer.headers["content-type"] == "text/plain"
            # An unknown token is any request: routed (here to HTTPS), never answered.
            other = await s.client.get(
                "/.well-known/acme-challenge/" + "z" * 20, headers={"Host": "hello.localhost"}
            )
            assert other.status_code == 308
            await s.store.delete(keys.challenge(TOKEN))
            await eventually(lambda: TOKEN.encode() not in s.ingress.challenges)
            assert (
                await s.client.get(path, headers={"Host": "hello.localhost"})
            ).status_code == 308
    assert sandbox.connections == 0  # nothing of it reached the app


async def test_a_token_the_mirror_has_not_heard_of_yet_is_read_from_the_store() -> None:
    """The control plane writes a challenge, then tells the CA to validate: the CA can ask
    before this replica's watch brings it (a CI run saw the order fail and wait 60 s for its
    retry). Here no mirror runs at all: the challenge is answered from the store."""
    async with open_store("memory://") as store:
        challenges = Challenges(store)
        challenge = AcmeChallenge(token=TOKEN, key_authorization=f"{TOKEN}.thumb", name="x.test")
        await store.put(keys.challenge(TOKEN), challenge)
        assert TOKEN.encode() not in challenges
        assert await challenges.answer(PATH + TOKEN.encode()) == f"{TOKEN}.thumb".encode()
        assert await challenges.answer(PATH + b"z" * 20) is None  # in no store: routed
        for made_up in MADE_UP:
            assert await challenges.answer(PATH + made_up) is None
        assert await challenges.answer(b"/" + TOKEN.encode()) is None  # not the challenge path
        assert challenges.reading == 0


async def test_requests_for_unheard_tokens_share_listings_at_most_ten_a_second() -> None:
    """A CA asks from several vantage points at once: they share one listing of the
    challenges, and each gets the answer. One after another, made-up tokens get a listing
    each at most every `LOOKUP_GAP`: a flood costs the store ten listings a second."""
    async with open_store("memory://") as store:
        challenges = Challenges(store)
        challenge = AcmeChallenge(token=TOKEN, key_authorization=f"{TOKEN}.thumb", name="x.test")
        await store.put(keys.challenge(TOKEN), challenge)
        answers: list[bytes | None] = []

        async def ask() -> None:
            answers.append(await challenges.answer(PATH + TOKEN.encode()))

        async with anyio.create_task_group() as tasks:
            for _ in range(5):
                tasks.start_soon(ask)
        assert answers == [f"{TOKEN}.thumb".encode()] * 5
        # A flood of made-up tokens beside: the CA's request is answered all the same.
        answers.clear()
        async with anyio.create_task_group() as tasks:
            for n in range(300):  # they all wait for one listing, the CA's request with them
                tasks.start_soon(challenges.answer, PATH + b"flood-%d" % n + b"x" * 16)
            tasks.start_soon(ask)  # (waiting for `reading == 300` first flaked: on a busy
            # machine the listing could end before the first look, its gap already past)
        assert answers == [f"{TOKEN}.thumb".encode()]
        started = anyio.current_time()
        for n in range(10):
            assert await challenges.answer(PATH + b"made-up-%d" % n + b"x" * 16) is None
        assert anyio.current_time() - started >= 9 * LOOKUP_GAP  # a listing each, spaced


async def test_a_stalled_store_lets_the_requests_go_on_unanswered_in_time() -> None:
    """A stalled store (etcd stopped): every request waiting for the listing goes on to
    routing within `LOOKUP_SECONDS`, with no error; made-up targets never wait at all."""
    with EtcdServer() as etcd:
        async with open_store(etcd.url) as store:
            challenges = Challenges(store)
            await store.put(keys.challenge(TOKEN), AcmeChallenge(
                token=TOKEN, key_authorization=f"{TOKEN}.thumb", name="x.test"
            ))  # fmt: skip
            assert await challenges.answer(PATH + TOKEN.encode()) == f"{TOKEN}.thumb".encode()
            assert etcd.process is not None
            os.kill(etcd.process.pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(LOOKUP_SECONDS / 2):  # a read would wait it all
                    for made_up in MADE_UP:
                        assert await challenges.answer(PATH + made_up) is None
                answers: list[bytes | None] = []

                async def ask() -> None:
                    answers.append(await challenges.answer(PATH + TOKEN.encode()))

                with anyio.fail_after(LOOKUP_SECONDS * 5):
                    async with anyio.create_task_group() as tasks:
                        for _ in range(100):
                            tasks.start_soon(ask)
                        await eventually(lambda: challenges.reading == 100)
                        assert answers == []  # the listing still waits on the stopped store
                assert answers == [None] * 100 and challenges.reading == 0
            finally:
                os.kill(etcd.process.pid, signal.SIGCONT)

            with anyio.fail_after(30):  # etcd back: answered again
                for _ in range(300):
                    if await challenges.answer(PATH + TOKEN.encode()) is not None:
                        break
                    await anyio.sleep(0.1)
            assert await challenges.answer(PATH + TOKEN.encode()) == f"{TOKEN}.thumb".encode()


async def test_certificates_from_acme_are_served_from_memory_and_a_file_wins(
    tmp_path: Path,
) -> None:
    acme_ca = make_ca(tmp_path / "acme-ca", "acme test CA")
    file_ca = make_ca(tmp_path / "file-ca", "file test CA")
    issued, files = tmp_path / "issued", tmp_path / "files"
    issued.mkdir()
    files.mkdir()
    for name in ("shop.test", "both.test"):
        issue(acme_ca, issued, name)
    issue(file_ca, files, "both.test")
    issue(file_ca, files, "fallback.test", "default")
    handed = Handed()
    with sandbox_recording([]) as sandbox:
        async with stack({"s1": sandbox.port}, tls_listen="127.0.0.1:0", certs=handed) as s:
            port = s.ingress.tls_address[1]
            with pytest.raises(ssl.SSLError, match=REFUSED):
                await anyio.to_thread.run_sync(served_by, port, "shop.test")
            handed.pairs = [
                ServedPair(
                    "shop.test",
                    (issued / "shop.test.crt").read_text(),
                    (issued / "shop.test.key").read_text(),
                    "1",
                )
            ]
            await s.store.put(keys.cert("shop.test"), record("shop.test", "1"))
            await eventually(lambda: "shop.test" in installed(s.ingress))
            assert await anyio.to_thread.run_sync(served_by, port, "shop.test") == "acme test CA"
            with pytest.raises(ssl.SSLError, match=REFUSED):  # never ordered here
                await anyio.to_thread.run_sync(served_by, port, "nobody.test")
            calls = handed.calls
            await s.store.put(keys.cert("shop.test"), record("shop.test", "1"))  # same serial
            await anyio.sleep(0.2)
            assert handed.calls == calls  # nothing new: not asked again
    # A directory too: its pair wins for its name, ACME's serves the rest, the default the
    # names neither covers.
    handed.pairs = [
        ServedPair(n, (issued / f"{n}.crt").read_text(), (issued / f"{n}.key").read_text(), "1")
        for n in ("shop.test", "both.test")
    ]
    with sandbox_recording([]) as sandbox:
        async with stack(
            {"s1": sandbox.port}, tls_listen="127.0.0.1:0", tls_dir=files, certs=handed
        ) as s:
            for name in ("shop.test", "both.test"):
                await s.store.put(keys.cert(name), record(name, "1"))
            await eventually(lambda: len(installed(s.ingress)) == 2)
            port = s.ingress.tls_address[1]
            found = {
                name: await anyio.to_thread.run_sync(served_by, port, name)
                for name in ("shop.test", "both.test", "other.test")
            }
    assert found == {
        "shop.test": "acme test CA",
        "both.test": "file test CA",
        "other.test": "file test CA",
    }


async def test_installing_many_certificates_leaves_the_event_loop_free(tmp_path: Path) -> None:
    """1,500 certificates load in a worker thread (about a second of OpenSSL): the loop goes on
    serving meanwhile; a renewal then loads one, not all of them again."""
    ca = make_ca(tmp_path / "ca", "acme test CA")
    issue(ca, tmp_path, "shop.test")
    chain, key = (tmp_path / "shop.test.crt").read_text(), (tmp_path / "shop.test.key").read_text()
    handed = Handed()
    handed.pairs = [ServedPair(f"n{i}.test", chain, key, "1") for i in range(1500)]
    gaps: list[float] = []
    async with stack({}, tls_listen="127.0.0.1:0", certs=handed) as s:
        done = anyio.Event()

        async def tick() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await anyio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(tick)
            await s.store.put(keys.cert("n0.test"), record("n0.test", "1"))
            await eventually(lambda: len(installed(s.ingress)) == 1500)
            handed.pairs[1] = ServedPair("n1.test", chain, key, "2")
            assert s.ingress.certificates is not None
            before = s.ingress.certificates._loaded["n2.test"]
            await s.store.put(keys.cert("n1.test"), record("n1.test", "2"))  # a renewal
            await eventually(lambda: installed(s.ingress).get("n1.test") == "2")
            assert s.ingress.certificates._loaded["n2.test"] is before  # not loaded again
            done.set()
    assert max(gaps) < 0.4, f"the event loop stalled {max(gaps):.2f} s"


def client_hello(name: str) -> bytes:
    """A real TLS client hello for `name`, as bytes."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    client = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_a_server_name_that_is_not_ascii_is_refused_without_a_traceback() -> None:
    """CPython cannot decode it for the SNI callback and reports that as an "exception
    ignored" per handshake (pytest fails a test on one). The ingress refuses it, quietly."""
    certificates = Certificates(None)
    hello = client_hello("aaaa.test").replace(b"aaaa.test", b"\xff\xfe\xfd\xfc.test")
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = certificates.context.wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(hello)
    with pytest.raises(ssl.SSLError):
        server.do_handshake()
