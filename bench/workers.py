"""Every core: `wakeful ingress --workers N` against nginx with N workers, same sandbox, same run.

The cluster: one etcd, `wakeful activator`, `wakeful node` (n1) and two apps the node runs in
sandboxes like any app: `fast`, a raw asyncio responder (`RESPONDER`, 2-byte body, keep-alive;
the stdlib sample app would be the thing measured) with `requests_per_instance` 100 (leases of
20, five to its one sandbox: the workers' lease caches share them, and a request none of them
can carry takes an overflow lease, an activator call of its own); and `slow`, the same
responder answering after 100 ms. Then, for each N in `--workers`, alternated (ingress, nginx,
nginx, ingress), `wakeful ingress --workers N` (a supervisor and N worker processes on one
port) and nginx with `worker_processes N` (upstream keep-alive, access log off, `reuseport`)
proxying to the same sandbox address:

1. wrk (`-t N -c 32N`) on `fast` for `--seconds`: req/s; the CPU time per request of the
   proxy's processes (user + system of the supervisor and its workers, or of nginx's master
   and workers, from /proc); the machine's busy share meanwhile; for the ingress its
   lease-cache misses and the activator's grants and overflow admissions per 1,000 requests
   (from their /metrics; a fresh ingress each run, so its first burst of misses counts). The
   sandbox driven directly is the ceiling.
2. Bursts (unless `--no-bursts`): hey on 200 connections at `--rate` on `slow`: p95 direct,
   through the ingress and through nginx (`bursts`).

On a machine with few cores wrk, the sandbox and the proxy share them: whole-machine figures,
the same footing for both proxies. From the repository root (needs `apt-get install
etcd-server nginx wrk hey bubblewrap`):

    .venv/bin/python -m bench.workers [--workers 1,2] [--seconds 10] [--rate 1000]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.workers")

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

from bench.cluster import Piece, wakeful_cli
from bench.harness import NGINX_HTTP, NGINX_KEEPALIVE, SLOW_DELAY, Result, run_hey, run_wrk
from bench.procfs import children, cpu_seconds, with_children
from wakeful.domain import keys
from wakeful.domain.models import Sandbox
from wakeful.store.testing import EtcdServer, free_port, wait_listening
from wakeful.store.url import open_store

WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
ADMIN_TOKEN = "workers-bench-admin-token"
APP = "fast"
SLOW = "slow"
"""The same responder answering after SLOW_DELAY: what a proxy adds to bursts (`bursts`)."""

RESPONDER = """\
import asyncio, os, sys

DELAY = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
ANSWER = b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nContent-Type: text/plain\\r\\n\\r\\nok"


class Responder(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        answers = self.buffer.count(b"\\r\\n\\r\\n")
        if answers:
            self.buffer = self.buffer[self.buffer.rfind(b"\\r\\n\\r\\n") + 4 :]
            if DELAY:
                asyncio.get_running_loop().call_later(DELAY, self.answer, answers)
            else:
                self.answer(answers)

    def answer(self, answers):
        if not self.transport.is_closing():
            self.transport.write(ANSWER * answers)


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        Responder, os.environ["HOST"], int(os.environ["PORT"]), backlog=4096
    )
    print(f"listening on {os.environ['HOST']}:{os.environ['PORT']}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
"""

TOML = """\
name = "{name}"
command = ["python3", "responder.py", "{delay}"]

[health]
path = "/healthz"

[concurrency]
mode = "auto"
requests_per_instance = {rpi}
min_instances = 1
max_instances = 1
scale_down_delay = "1h"
suspend_delay = 0
"""

NGINX = """
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
{http}
    upstream sandbox {{ server {upstream}; keepalive {keepalive}; }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            proxy_pass http://sandbox;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.etcd = EtcdServer()
        self.pieces: list[Piece] = []
        self.api = f"http://127.0.0.1:{free_port()}"
        self.env = {
            **os.environ,
            "WAKEFUL_STORE_URL": "",
            "WAKEFUL_STORE_NAMESPACE": f"/workers-{uuid.uuid4().hex[:8]}/",
            "WAKEFUL_TOKEN": ADMIN_TOKEN,
            "WAKEFUL_ARTIFACT_DIR": str(root / "artifacts"),
            "WAKEFUL_SECRETS_KEYS": str(root / "secret-keys"),
        }

    def cli(self, *args: str) -> str:
        return wakeful_cli(self.env, self.api, *args)

    def piece_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k != "WAKEFUL_TOKEN"}
        return env | {"WAKEFUL_API": self.api} | extra

    def start(self) -> None:
        self.etcd.start()
        self.env["WAKEFUL_STORE_URL"] = self.etcd.url
        listen = self.api.removeprefix("http://")
        activator = Piece(
            "activator",
            "activator",
            [*WAKEFUL, "--data-dir", str(self.root / "activator"), "activator"],
            {**self.env, "WAKEFUL_LISTEN": listen, "WAKEFUL_ADVERTISE_URL": self.api},
        )
        activator.start()
        self.pieces.append(activator)
        token = self.cli("tokens", "create", "--role", "node", "--name", "n1").strip()
        node = Piece(
            "n1",
            "node",
            [*WAKEFUL, "node"],
            self.piece_env(
                WAKEFUL_NODE_NAME="n1",
                WAKEFUL_DATA_DIR=str(self.root / "n1"),
                WAKEFUL_NODE_TOKEN=token,
            ),
        )
        node.start()
        self.pieces.append(node)
        for name, delay, rpi in ((APP, 0.0, 100), (SLOW, SLOW_DELAY, 1000)):
            app = self.root / name
            app.mkdir()
            (app / "responder.py").write_text(RESPONDER)
            (app / "wakeful.toml").write_text(TOML.format(name=name, delay=delay, rpi=rpi))
            self.cli("deploy", str(app))

    def sandbox_address(self, app: str = APP) -> str:
        """host:port of `app`'s one running sandbox, from its record in the store."""

        async def running() -> list[str]:
            url, namespace = self.env["WAKEFUL_STORE_URL"], self.env["WAKEFUL_STORE_NAMESPACE"]
            async with open_store(url, namespace=namespace) as store:
                listing = await store.list(keys.SANDBOXES, Sandbox)
            return [
                item.value.address or ""
                for item in listing.items
                if item.value.app == app and item.value.routable
            ]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            urls = anyio.run(running)
            if urls:
                return urls[0].removeprefix("http://").rstrip("/")
            time.sleep(0.2)
        raise RuntimeError(f"no running sandbox of {app}")

    @contextlib.contextmanager
    def ingress(
        self, workers: int, checkout: Path | None = None
    ) -> Iterator[tuple[str, list[int], tuple[str, ...]]]:
        """`wakeful ingress --workers N`: its address, its processes' pids, and the /metrics
        bases (its admin address, the activator's). `checkout`: the repository whose
        `wakeful` it runs (`bench.builds`), else this one."""
        name = f"w{workers}-{uuid.uuid4().hex[:6]}"
        token = self.cli("tokens", "create", "--role", "ingress", "--name", name)
        port, admin = free_port(), f"127.0.0.1:{free_port()}"
        piece = Piece(
            f"ingress-{workers}",
            "ingress",
            [*WAKEFUL, "ingress", "--workers", str(workers)],
            self.piece_env(
                WAKEFUL_LISTEN=f"127.0.0.1:{port}",
                WAKEFUL_ADMIN_LISTEN=admin,
                WAKEFUL_INGRESS_TOKEN=token.strip(),
            ),
            checkout,
        )
        piece.start()
        try:
            wait_listening(port, within=60)  # the supervisor announces once every worker is ready
            time.sleep(0.5)
            assert piece.process is not None
            pid = piece.process.pid
            pids = [pid, *children(pid)] if workers > 1 else [pid]
            yield f"http://127.0.0.1:{port}", pids, (f"http://{admin}", self.api)
        finally:
            piece.signal(signal.SIGTERM)

    def close(self) -> None:
        for piece in reversed(self.pieces):
            piece.signal(signal.SIGTERM)
        self.etcd.close()


def show(rows: dict[str, list[Run]], first: str) -> None:
    """Each side's runs, then their means and the CPU ratio."""
    for side, runs in rows.items():
        shown = ", ".join(
            f"{r.result.rps:,.0f} req/s {r.cpu_us:.1f} µs (busy {r.busy:.0%})" for r in runs
        )
        errors = " ".join(r.result.errors for r in runs if r.result.errors)
        print(f"  {side:10} {shown}" + (f"  ({errors})" if errors else ""))
        for r in runs:
            if r.per_1000:
                each = ", ".join(f"{k} {v:.1f}" for k, v in r.per_1000.items())
                print(f"             per 1,000 requests: {each}")
    ours = statistics.mean(r.cpu_us for r in rows[first])
    theirs = statistics.mean(r.cpu_us for r in rows["nginx"])
    ours_rps = statistics.mean(r.result.rps for r in rows[first])
    theirs_rps = statistics.mean(r.result.rps for r in rows["nginx"])
    print(
        f"  mean: {first} {ours_rps:,.0f} req/s at {ours:.1f} µs CPU/request, "
        f"nginx {theirs_rps:,.0f} at {theirs:.1f} ({ours / theirs:.1f}x)"
    )


@contextlib.contextmanager
def nginx(
    root: Path, workers: int, upstream: str
) -> Iterator[tuple[str, list[int], tuple[str, ...]]]:
    directory = Path(tempfile.mkdtemp(dir=root))
    port = free_port()
    conf = directory / "nginx.conf"
    http = NGINX_HTTP.format(dir=directory)
    conf.write_text(
        NGINX.format(
            workers=workers,
            dir=directory,
            http=http,
            upstream=upstream,
            port=port,
            keepalive=NGINX_KEEPALIVE,
        )
    )
    process = subprocess.Popen(
        ["nginx", "-p", str(directory), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, within=30)
        yield f"http://127.0.0.1:{port}", with_children(process.pid, workers), ()
    finally:
        process.terminate()
        process.wait(timeout=30)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU so far, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@dataclass
class Run:
    result: Result
    cpu_us: float
    """The proxy's CPU µs per request."""
    busy: float
    """The machine's CPUs busy meanwhile, 0..1 (everything: wrk, the sandbox, the proxy)."""
    per_1000: dict[str, float] = field(default_factory=dict)
    """Lease-cache misses, activator grants and overflow admissions per 1,000 requests."""


COUNTED = {
    "misses": "wakeful_ingress_lease_cache_misses_total",
    "grants": "wakeful_activator_lease_wait_seconds_count",
    "overflow": "wakeful_activator_overflow_admissions_total",
}


def counted(*urls: str) -> dict[str, float]:
    """The `COUNTED` samples at these /metrics, summed over labels and URLs."""
    totals = dict.fromkeys(COUNTED, 0.0)
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            for label, wanted in COUNTED.items():
                if name == wanted:
                    totals[label] += float(line.rsplit(" ", 1)[1])
    return totals


def drive(
    url: str, pids: list[int], workers: int, seconds: int, metrics: tuple[str, ...] = ()
) -> Run:
    """wrk at `url` (Host: the app); req/s, the pids' CPU µs per request, and the `COUNTED`
    samples per 1,000 requests at `metrics` (counted from before the warm-up: a fresh
    ingress's first misses are the point)."""
    at_start = counted(*metrics) if metrics else {}
    anyio.run(run_wrk, url, 1, f"{APP}.localhost", None, 32 * workers)  # warm: leases, pools
    before, (busy0, total0) = cpu_seconds(*pids), machine_ticks()
    result = anyio.run(run_wrk, url, seconds, f"{APP}.localhost", None, 32 * workers)
    used, (busy1, total1) = cpu_seconds(*pids) - before, machine_ticks()
    requests = result.rps * seconds
    cpu = used / requests * 1e6 if requests else float("nan")
    run = Run(result, cpu, (busy1 - busy0) / max(1, total1 - total0))
    if metrics and requests:
        at_end = counted(*metrics)
        run.per_1000 = {k: (at_end[k] - at_start[k]) / requests * 1000 for k in COUNTED}
    return run


def bursts(
    cluster: Cluster, root: Path, count: int, seconds: int, rate: int
) -> dict[str, list[Result]]:
    """hey on 200 connections at `rate` against `SLOW` (each answer after 100 ms): its
    workers fire on the same tick, so each tick is a burst of 200, and what a proxy adds at
    p95 is mostly how long the last of a burst waits behind the others. Direct, then the
    ingress and nginx with `count` workers each, alternated; hey's first second not counted
    (it opens its 200 connections at once, and a proxy opens 200 upstream)."""
    upstream = cluster.sandbox_address(SLOW)
    host = f"{SLOW}.localhost"
    found: dict[str, list[Result]] = {"direct": [], "ingress": [], "nginx": []}

    def hey(url: str) -> Result:
        anyio.run(run_hey, url, 1, rate, 200, host)
        return anyio.run(run_hey, url, seconds, rate, 200, host)

    found["direct"].append(hey(f"http://{upstream}/"))
    for side in ("ingress", "nginx", "nginx", "ingress"):
        run = cluster.ingress(count) if side == "ingress" else nginx(root, count, upstream)
        with run as (url, _, _):
            found[side].append(hey(url + "/"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=1000, help="hey's rate in the bursts")
    parser.add_argument("--no-bursts", action="store_true", help="skip the 100 ms backend")
    args = parser.parse_args()
    for tool in ("etcd", "nginx", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install etcd-server nginx wrk)")
    counts = [int(n) for n in args.workers.split(",")]
    root = Path(tempfile.mkdtemp(prefix="wakeful-bench-workers-"))
    cluster = Cluster(root)
    try:
        cluster.start()
        upstream = cluster.sandbox_address()
        print(f"cores: {os.cpu_count()}, sandbox {upstream}, wrk -c 32N, {args.seconds} s each")
        direct = drive(f"http://{upstream}", [], 1, args.seconds)
        print(f"direct to the sandbox: {direct.result.rps:,.0f} req/s, busy {direct.busy:.0%}")
        for count in counts:
            rows: dict[str, list[Run]] = {"ingress": [], "nginx": []}
            for side in ("ingress", "nginx", "nginx", "ingress"):
                run = cluster.ingress(count) if side == "ingress" else nginx(root, count, upstream)
                with run as (url, pids, metrics):
                    rows[side].append(drive(url, pids, count, args.seconds, metrics))
            print(f"\n{count} worker(s):")
            show(rows, "ingress")
        if not args.no_bursts:
            print(f"\nbursts: hey -c 200 at {args.rate} req/s, {SLOW_DELAY * 1000:.0f} ms answers")
            for count in counts:
                found = bursts(cluster, root, count, args.seconds, args.rate)
                direct = found["direct"][0].p95_ms
                print(f"  {count} worker(s): p95 direct {direct:.1f} ms")
                for side in ("ingress", "nginx"):
                    shown = ", ".join(
                        f"{r.p95_ms:.1f} ms ({r.p95_ms - direct:+.1f})" for r in found[side]
                    )
                    errors = " ".join(r.errors for r in found[side] if r.errors)
                    print(f"    {side:8} p95 {shown}" + (f"  ({errors})" if errors else ""))
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
