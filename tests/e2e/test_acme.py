"""Certificates from ACME end to end (issue 38), against Debian's pebble with validation on:
the pieces as separate processes on etcd, the activator ordering for an app's `hosts`, the
ingress answering pebble's HTTP-01 validation on its plain listener and then serving the
certificate, which it got from the control API with its ingress token, on its TLS listener,
with no certificate directory at all."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import anyio
import httpx
import pytest
from cryptography import x509

from tests.e2e.test_secrets_distributed import _etcd_values
from tests.support.cluster import deploy, make_token, piece_env, start_cluster, wakeful_cli
from tests.support.pebble import NEW_ORDER, Pebble, pebble_installed, running_pebble
from tests.support.up import HELLO, WAKEFUL, start_up, stop_up
from wakeful.store.testing import EtcdServer, free_port

pytestmark = [
    pytest.mark.skipif(not pebble_installed(), reason="needs Debian's pebble"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the node agent isolates apps as root"),
]

SHOP = "shop.test"


def shop_app(root: Path) -> Path:
    app = root / "shop"
    app.mkdir()
    for name in ("app.py",):
        (app / name).write_bytes((HELLO / name).read_bytes())
    (app / "wakeful.toml").write_text(
        f'name = "shop"\ncommand = ["python3", "app.py"]\nhosts = ["{SHOP}"]\n'
        '[health]\npath = "/healthz"\ntimeout = 20\n'
    )
    return app


def https_get(port: int, name: str, roots: bytes) -> tuple[str, str]:
    """(status line, issuer) of `GET /` over TLS to 127.0.0.1:`port` for `name`, the chain
    checked against pebble's issuing root and the name against the certificate."""
    context = ssl.create_default_context(cadata=roots.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        issuer = dict(pair[0] for pair in tls.getpeercert()["issuer"])  # type: ignore[index]
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    return answer.split(b"\r\n", 1)[0].decode(), str(issuer["commonName"])


def certs(api: str, env: dict[str, str]) -> dict[str, dict[str, object]] | None:
    """`wakeful certs --json` by name; None while the control plane does not answer (a
    standby not yet leading)."""
    listed = wakeful_cli(api, env, "certs", "--json")
    if listed.returncode != 0:
        return None
    return {entry["name"]: entry for entry in json.loads(listed.stdout)}


def wait_state(
    api: str, env: dict[str, str], name: str, state: str = "valid", within: float = 120
) -> dict[str, object]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        entry = (certs(api, env) or {}).get(name)
        if entry is not None and entry["state"] == state:
            return entry
        time.sleep(0.25)
    raise AssertionError(f"{name} not {state} within {within:g} s: {certs(api, env)}")


def acme_env(pebble: Pebble) -> dict[str, str]:
    return {
        "WAKEFUL_ACME_EMAIL": "ops@shop.test",
        "WAKEFUL_ACME_DIRECTORY": pebble.directory,
        "WAKEFUL_ACME_CA": str(pebble.ca_file),
    }


def test_a_deployed_host_gets_a_certificate_every_ingress_serves(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    plain, tls, second_tls = free_port(), free_port(), free_port()
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        role_env = {
            "activator": acme_env(pebble),
            "ingress": {
                "WAKEFUL_LISTEN": f"127.0.0.1:{plain}",
                "WAKEFUL_TLS_LISTEN": f"127.0.0.1:{tls}",
            },
        }
        processes: list[subprocess.Popen[str]] = []
        with start_cluster(
            etcd_server.url, tmp_path, nodes=("n1",), role_env=role_env, processes=processes
        ) as (api, _, env):
            # A second ingress replica, with a token of its own and no certificate directory.
            second = {
                "WAKEFUL_LISTEN": f"127.0.0.1:{free_port()}",
                "WAKEFUL_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
                "WAKEFUL_TLS_LISTEN": f"127.0.0.1:{second_tls}",
                "WAKEFUL_API": env["WAKEFUL_API"],
            }
            second["WAKEFUL_INGRESS_TOKEN"] = make_token(
                env, "ingress", {"WAKEFUL_NODE_NAME": "i2"}
            )
            replica = subprocess.Popen(
                [*WAKEFUL, "ingress"],
                env=piece_env(env, second),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            processes.append(replica)
            started = time.monotonic()
            deploy(api, env, shop_app(tmp_path))
            wait_state(api, env, SHOP)
            issued_in = time.monotonic() - started
            roots = pebble.issuing_roots()
            for port in (tls, second_tls):
                deadline = time.monotonic() + 30
                while True:  # the second replica may still be fetching it
                    try:
                        status, issuer = https_get(port, SHOP, roots)
                        break
                    except (ssl.SSLError, OSError):
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
                assert status == "HTTP/1.1 200 OK", (port, status)
                assert "Pebble" in issuer, issuer
            # A name no app has: its handshake is refused, and nothing is ordered for it.
            with pytest.raises((ssl.SSLError, ConnectionResetError)):
                https_get(tls, "nobody.test", roots)
            assert pebble.log().count(NEW_ORDER) == 1, pebble.log()[-3000:]
            listed = wakeful_cli(api, env, "certs")
            assert SHOP in listed.stdout and "valid" in listed.stdout, listed.stdout
            with concurrent.futures.ThreadPoolExecutor(1) as thread:  # this thread has a loop
                held = thread.submit(anyio.run, _etcd_values, etcd_server).result(timeout=60)
            assert f"certs/{SHOP}".encode() in held and b"acme/account" in held
            assert b"PRIVATE KEY" not in held  # every key sealed
            print(f"deploy to a valid certificate: {issued_in:.1f} s")


def test_a_leader_killed_mid_order_leaves_it_to_the_next_which_completes_it(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """The leading activator dies (SIGKILL, a failpoint) right after it published an order's
    challenge; the standby takes over, clears the challenge left behind and orders the name
    again with the same account."""
    plain, tls = free_port(), free_port()
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        role_env = {
            "activator": acme_env(pebble),
            "activator:0": {"WAKEFUL_FAILPOINTS": "acme-after-publish"},
            "ingress": {
                "WAKEFUL_LISTEN": f"127.0.0.1:{plain}",
                "WAKEFUL_TLS_LISTEN": f"127.0.0.1:{tls}",
            },
        }
        processes: list[subprocess.Popen[str]] = []
        urls: list[str] = []
        with start_cluster(
            etcd_server.url,
            tmp_path,
            nodes=("n1",),
            activators=2,
            role_env=role_env,
            processes=processes,
            activator_urls=urls,
        ) as (api, _, env):
            deploying = subprocess.Popen(  # its leader may die before it says so: not waited
                [*WAKEFUL, "--api", api, "deploy", str(shop_app(tmp_path))],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            processes.append(deploying)
            said = processes[0].communicate(timeout=60)[0]
            assert "failpoint acme-after-publish reached" in said, said[-3000:]
            wait_state(urls[1], env, SHOP)
            status, issuer = https_get(tls, SHOP, pebble.issuing_roots())
            assert status == "HTTP/1.1 200 OK" and "Pebble" in issuer
            ca_log = pebble.log()  # the dead leader's order, and the heir's
            assert ca_log.count(NEW_ORDER) == 2, ca_log[-6000:]
            with concurrent.futures.ThreadPoolExecutor(1) as thread:
                held = thread.submit(anyio.run, _etcd_values, etcd_server).result(timeout=60)
            assert b"acme/challenges/" not in held  # none left behind


def served_serial(port: int, name: str, roots: bytes) -> int:
    context = ssl.create_default_context(cadata=roots.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


class TlsProber:
    """HTTPS GETs for `name` every 20 ms in a thread, the chain checked: what failed."""

    def __init__(self, port: int, name: str, roots: bytes) -> None:
        self.failures: list[str] = []
        self.answered = 0
        self._args = (port, name, roots)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TlsProber:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                status, _ = https_get(*self._args)
            except (ssl.SSLError, OSError) as exc:
                self.failures.append(repr(exc))
                continue
            if status != "HTTP/1.1 200 OK":
                self.failures.append(status)
            self.answered += 1


def test_wakeful_up_renews_with_no_failed_request_and_keeps_serving_when_acme_is_down(
    tmp_path: Path,
) -> None:
    """pebble's certificates live 15 s here: renewed at 10 s under a prober over HTTPS that
    sees no failure; then pebble stops, the next renewal fails, `wakeful certs` says so with
    the error and the next attempt a minute on, and the last certificate is still served."""
    plain, tls = free_port(), free_port()
    app = shop_app(tmp_path)
    with running_pebble(tmp_path / "pebble", http_port=plain, validity=15) as pebble:
        env = {**acme_env(pebble), "WAKEFUL_TLS_LISTEN": f"127.0.0.1:{tls}"}
        up = start_up(tmp_path, app, env=env, proxy=plain)
        try:
            cli = {**os.environ, "WAKEFUL_TOKEN": up.token}
            first = wait_state(up.api, cli, SHOP)
            roots = pebble.issuing_roots()
            with TlsProber(tls, SHOP, roots) as prober:
                deadline = time.monotonic() + 60
                while served_serial(tls, SHOP, roots) == int(str(first["serial"]), 16):
                    assert time.monotonic() < deadline, "not renewed within 60 s"
                    time.sleep(0.2)
            assert not prober.failures, prober.failures[:3]
            assert prober.answered > 50
            renewed = wait_state(up.api, cli, SHOP)
        except BaseException:
            print(stop_up(up)[-5000:])
            raise
    try:  # pebble is gone: the next renewal fails, the certificate in hand is still served
        failing = wait_state(up.api, cli, SHOP, "failing", within=60)
        now = time.time()
        assert "failed" in str(failing["last_error"]) or "cannot" in str(failing["last_error"])
        assert 30 < float(str(failing["next_attempt"])) - now <= 60
        assert failing["serial"] == renewed["serial"]
        assert float(str(failing["not_after"])) > now  # not expired yet: served
        assert served_serial(tls, SHOP, roots) == int(str(renewed["serial"]), 16)
        metrics = httpx.get(f"{up.api}/metrics", timeout=30).text
        assert f'wakeful_cert_expiry_timestamp_seconds{{name="{SHOP}"}}' in metrics
        assert 'wakeful_acme_orders_total{result="failed"} 1.0' in metrics
    finally:
        stop_up(up)
