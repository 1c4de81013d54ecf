"""What a request costs under `wakeful up`, against nginx proxying to the same sandbox.

`wakeful up` (the one-process default a user runs: control plane, node agent and ingress on
one event loop, its access log and Server-Timing on) with `bench.workers`' two apps: `fast`,
a raw asyncio responder in its sandbox, and `slow`. Then wrk (`-t1 -c32`) on `fast` through
`wakeful up` and through nginx with one worker proxying to `fast`'s sandbox, alternated (up,
nginx, nginx, up): req/s and the CPU time per request of the whole `wakeful up` process
(its sandboxes are processes of their own) and of nginx's. Compare with the ingress alone on
the same machine: `python -m bench.workers --workers 1`.

`--workers 1,2`: `wakeful up` with WAKEFUL_INGRESS_WORKERS=N (its ingress as N worker
processes on the same store file) against nginx with N workers, wrk with 32 connections per
worker; the CPU counted is `wakeful up`'s process and its ingress workers' (not its sandboxes).

From the repository root (needs `apt-get install nginx wrk bubblewrap`):

    .venv/bin/python -m bench.upcost [--seconds 10] [--workers 1,2]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.upcost")

import argparse
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.cluster import Piece, wakeful_cli
from bench.harness import SLOW_DELAY
from bench.procfs import ingress_workers
from bench.workers import APP, RESPONDER, SLOW, TOML, WAKEFUL, Run, drive, nginx, show
from wakeful.store.testing import free_port, wait_listening


@contextlib.contextmanager
def up(root: Path, workers: int = 1) -> Iterator[tuple[str, list[int], str]]:
    """`wakeful up` with `fast` and `slow` (the one-process default a user runs: control
    plane, node agent and ingress on one loop, access log and Server-Timing on; with
    `workers` above 1, its ingress as that many processes): its ingress's address, its pid
    and its workers' (its sandboxes are processes of their own), and the address of `fast`'s
    sandbox, from what the responder printed (`wakeful logs`)."""
    data, apps = root / f"up{workers}", root / f"up{workers}-apps"
    apps.mkdir()
    dirs = []
    for name, delay, rpi in ((APP, 0.0, 100), (SLOW, SLOW_DELAY, 1000)):
        app = apps / name
        app.mkdir()
        (app / "responder.py").write_text(RESPONDER)
        (app / "wakeful.toml").write_text(TOML.format(name=name, delay=delay, rpi=rpi))
        dirs.append(str(app))
    port, api = free_port(), f"127.0.0.1:{free_port()}"
    piece = Piece(
        "up",
        "wakeful",
        [
            *WAKEFUL,
            "up",
            "--data-dir",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--api-listen",
            api,
            "--admin-listen",
            f"127.0.0.1:{free_port()}",
            *dirs,
        ],
        {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
        | {"WAKEFUL_INGRESS_WORKERS": str(workers)}
        | {k: v for k, v in os.environ.items() if k == "WAKEFUL_PURE_PYTHON"},
    )
    piece.start()
    try:
        env = {"WAKEFUL_TOKEN": (data / "token").read_text().strip()}
        deadline = time.monotonic() + 60
        address = ""
        while not address:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{APP} never said where it listens under wakeful up")
            time.sleep(0.3)
            said = wakeful_cli(env, f"http://{api}", "logs", APP, check=False)
            found = re.search(r"listening on (\S+:\d+)", said)
            address = found.group(1) if found else ""
        wait_listening(port, within=60)
        assert piece.process is not None
        pids = [piece.process.pid, *ingress_workers(piece.process.pid)]
        assert len(pids) == 1 + (workers if workers > 1 else 0), pids
        yield f"http://127.0.0.1:{port}", pids, address
    finally:
        piece.signal(signal.SIGTERM)


def compare_up(root: Path, seconds: int, workers: int = 1) -> None:
    """`wakeful up` against nginx (as many workers) proxying to the same sandbox, alternated
    (up, nginx, nginx, up): req/s and CPU µs per request (of the whole `wakeful up` process
    and its ingress workers)."""
    rows: dict[str, list[Run]] = {"up": [], "nginx": []}
    with up(root, workers) as (url, pids, upstream):
        for side in ("up", "nginx", "nginx", "up"):
            if side == "up":
                rows[side].append(drive(url, pids, workers, seconds))
            else:
                with nginx(root, workers, upstream) as (nginx_url, nginx_pids, _):
                    rows[side].append(drive(nginx_url, nginx_pids, workers, seconds))
    show(rows, "up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument(
        "--workers", default="1", help="ingress (and nginx) workers, comma-separated: 1,2"
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install nginx wrk)")
    root = Path(tempfile.mkdtemp(prefix="wakeful-bench-upcost-"))
    try:
        print(f"cores: {os.cpu_count()}, wrk -t1 -c32 per worker, {args.seconds} s each")
        for workers in counts:
            shape = "one process" if workers == 1 else f"{workers} ingress workers"
            print(f"wakeful up ({shape}, its own sandbox of fast), {workers} nginx worker(s):")
            compare_up(root, args.seconds, workers)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
