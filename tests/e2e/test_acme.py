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
import time
from pathlib import Path

import anyio
import pytest

from tests.e2e.test_secrets_distributed import _etcd_values
from tests.support.cluster import deploy, make_token, piece_env, start_cluster, wakeful_cli
from tests.support.pebble import NEW_ORDER, Pebble, pebble_installed, running_pebble
from tests.support.up import HELLO, WAKEFUL
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


def certs(api: str, env: dict[str, str]) -> dict[str, dict[str, object]]:
    listed = wakeful_cli(api, env, "certs", "--json")
    assert listed.returncode == 0, listed.stderr
    return {entry["name"]: entry for entry in json.loads(listed.stdout)}


def wait_valid(api: str, env: dict[str, str], name: str, within: float = 120) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        entry = certs(api, env).get(name)
        if entry is not None and entry["state"] == "valid":
            return
        time.sleep(0.25)
    raise AssertionError(f"{name} not valid within {within:g} s: {certs(api, env)}")


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
            wait_valid(api, env, SHOP)
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
