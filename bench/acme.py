"""Benchmark automatic HTTPS: from `wakeful deploy` of an app with a new name to its first
HTTPS answer, against its first plain HTTP answer in the same run.

One `wakeful up` with certificates from ACME on (`WAKEFUL_ACME_*`), against Debian's pebble on
loopback with validation on (`PEBBLE_VA_NOSLEEP`: pebble's own random 0-15 s validation delay
off; Let's Encrypt's delays come on top of these figures). For each of `--apps` apps (the
sample app, `hosts = ["shopN.bench"]`), one thread polls plain HTTP and one polls HTTPS (the
chain checked against pebble's root, SNI the new name) every 10 ms from the moment the deploy
starts; each records its first 200. HTTP's time is the baseline: the deploy and the app's cold
start, which HTTPS waits for too. HTTPS - HTTP is what getting the certificate adds.

From the repository root (needs Debian's pebble): `python -m bench.acme [--apps 5]`
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.acme")

import argparse
import os
import platform
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.coldstart import HELLO, WAKEFUL, pct, running_up
from tests.support.pebble import running_pebble
from wakeful.store.testing import free_port

POLL = 0.01
WITHIN = 120.0


def get(port: int, name: str, roots: bytes | None) -> bool:
    """One GET / for `name` to 127.0.0.1:`port`, over TLS when `roots` is given: a 200?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            conn: socket.socket = raw
            if roots is not None:
                context = ssl.create_default_context(cadata=roots.decode())
                conn = context.wrap_socket(raw, server_hostname=name)
            conn.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
            head = conn.recv(64)
    except (OSError, ssl.SSLError):
        return False
    return head.startswith(b"HTTP/1.1 200 ")


def first_200(
    port: int, name: str, roots: bytes | None, start: float, out: dict[str, float]
) -> None:
    kind = "https" if roots is not None else "http"
    while time.perf_counter() - start < WITHIN:
        if get(port, name, roots):
            out[kind] = time.perf_counter() - start
            return
        time.sleep(POLL)


def app_dir(root: Path, index: int) -> tuple[Path, str]:
    name, host = f"shop{index}", f"shop{index}.bench"
    target = root / name
    shutil.copytree(HELLO, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "wakeful.toml").write_text(
        f'name = "{name}"\ncommand = ["python3", "app.py"]\nhosts = ["{host}"]\n'
        '[health]\npath = "/healthz"\ntimeout = 30\n'
    )
    return target, host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=5)
    args = parser.parse_args()
    print(f"python -m bench.acme --apps {args.apps}")
    print(
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"
    )
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-acme-") as tmp:
        root = Path(tmp)
        plain, tls = free_port(), free_port()
        with running_pebble(root / "pebble", http_port=plain) as pebble:
            env = {
                "WAKEFUL_ACME_EMAIL": "bench@shop.bench",
                "WAKEFUL_ACME_DIRECTORY": pebble.directory,
                "WAKEFUL_ACME_CA": str(pebble.ca_file),
                "WAKEFUL_TLS_LISTEN": f"127.0.0.1:{tls}",
            }
            with running_up(root, [], keep_logs=None, env=env, proxy=plain) as up:
                roots = pebble.issuing_roots()
                cli = {**os.environ, "WAKEFUL_TOKEN": (up.data_dir / "token").read_text().strip()}
                rows = []
                for index in range(1, args.apps + 1):
                    target, host = app_dir(root, index)
                    found: dict[str, float] = {}
                    start = time.perf_counter()
                    pollers = [
                        threading.Thread(target=first_200, args=(plain, host, None, start, found)),
                        threading.Thread(target=first_200, args=(tls, host, roots, start, found)),
                    ]
                    for poller in pollers:
                        poller.start()
                    deployed = subprocess.run(
                        [*WAKEFUL, "--api", up.api, "deploy", str(target)],
                        env=cli, capture_output=True, text=True, check=False,
                    )  # fmt: skip
                    took = time.perf_counter() - start
                    for poller in pollers:
                        poller.join()
                    if deployed.returncode != 0 or len(found) < 2:
                        print(f"  {host}: deploy rc {deployed.returncode}, found {found}")
                        print(deployed.stdout[-2000:], deployed.stderr[-2000:])
                        continue
                    http, https = found["http"], found["https"]
                    rows.append((took, http, https))
                    print(
                        f"  {host}: deploy command {took:.2f} s, first HTTP 200 {http:.2f} s,"
                        f" first HTTPS 200 {https:.2f} s (+{https - http:.2f} s)"
                    )
            up.report()
    if rows:
        for label, column in (("deploy command", 0), ("first HTTP", 1), ("first HTTPS", 2)):
            values = [row[column] for row in rows]
            print(f"{label:>16}: p50 {pct(values, 0.5):.2f} s, max {max(values):.2f} s")
        added = [row[2] - row[1] for row in rows]
        print(f"{'HTTPS - HTTP':>16}: p50 {pct(added, 0.5):.2f} s, max {max(added):.2f} s")


if __name__ == "__main__":
    main()
