"""What a tunnel costs, and how it grows: a dial-out node served through ingress replicas
behind Debian's nginx (seed 003).

The cluster: one etcd, one activator, `--replicas` ingress replicas, and nginx in front of
them twice: for clients, and for tunnels (each stream a WebSocket, which nginx places on a
replica of its own choosing, round robin, as any balancer does). Node `n1` dials out through
nginx (`WAKEFUL_TUNNEL`); node `n2` is dialed directly, as before. Every piece is a `wakeful`
process of its own.

1. **Fixed rate**: the same app (the sample, one sandbox each) on `n2` (direct) and on `n1`
   (through a tunnel), `hey` at `--rate` requests per second through nginx for `--seconds`:
   throughput, p50 and p99 for each. Goal: the tunnel's p50 at most 2x the direct path's.
2. **Cold burst**: `--burst` concurrent calls (each `GET /sleep?s=S`, 10 s by default, so
   none ends before all have begun) at an app on `n1` whose node holds only its resting
   reserve: the longest any call waited for a stream (its latency minus S; with S longer than
   that, every call is then in flight at once), the streams the node opened on each replica,
   and, after the pruning window (`--prune`; pruning is shortened to 10 s unused in this
   run), the streams left.

From the repository root (needs `apt-get install etcd-server nginx hey`):

    .venv/bin/python -m bench.tunnel                 # 2 replicas, 500 req/s for 10 s, 1,000 calls
    .venv/bin/python -m bench.tunnel --replicas 3 --burst 1000 --seconds 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.cluster import Piece, wakeful_cli
from bench.harness import NGINX_HTTP
from wakeful.store.testing import EtcdServer, free_port

WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
HELLO = Path(__file__).parents[1] / "examples" / "hello"
ADMIN_TOKEN = "tunnel-bench-admin-token"
STEADY: dict[str, object] = {"min_instances": 1, "max_instances": 1, "requests_per_instance": 1000}
"""The fixed-rate apps: one sandbox each, whose cached leases cover the rate, so the figures
are the data path's and not the activator's (an overflow lease is one round trip each)."""

NGINX_CONF = """
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
{own_files}
    upstream ingresses {{
{http_servers}
        keepalive 256;
    }}
    upstream tunnels {{
{tunnel_servers}
    }}
    server {{
        listen 127.0.0.1:{http};
        location / {{
            proxy_pass http://ingresses;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_next_upstream error timeout;
            proxy_read_timeout 120s;
        }}
    }}
    server {{
        listen 127.0.0.1:{tunnel}{tls};
        location / {{
            proxy_pass http://tunnels;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_set_header Host $host;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            proxy_buffering off;
        }}
    }}
}}
"""


@dataclass
class TunnelCluster:
    root: Path
    env: dict[str, str]
    api: str = ""
    proxy: str = ""
    tunnel: str = ""
    activator: Piece | None = None
    nodes: dict[str, Piece] = field(default_factory=dict)
    replicas: list[Piece] = field(default_factory=list)
    replica_admin: list[str] = field(default_factory=list)
    nginx: subprocess.Popen[bytes] | None = None

    def cli(self, *args: str, check: bool = True) -> str:
        return wakeful_cli(self.env, self.api, *args, check=check)

    def admin(self, path: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        return httpx.get(self.api + path, headers=headers, timeout=30)

    def node_record(self, name: str = "n1") -> dict[str, object]:
        answer = self.admin(f"/v1/nodes/{name}")
        answer.raise_for_status()
        found: dict[str, object] = answer.json()
        return found

    def tunnel_table(self, name: str = "n1") -> dict[str, object]:
        """The node's coverage table; empty while the node has not registered yet."""
        answer = self.admin(f"/v1/nodes/{name}")
        if answer.status_code == 404:
            return {}
        answer.raise_for_status()
        tunnel = answer.json().get("tunnel")
        return tunnel if isinstance(tunnel, dict) else {}

    def streams_by_replica(self, name: str = "n1") -> dict[str, int]:
        replicas = self.tunnel_table(name).get("replicas") or []
        assert isinstance(replicas, list)
        return {r["replica"]: r["streams"] for r in replicas}

    def app(self, name: str, **settings: object) -> Path:
        """The sample app under `name`, with `[concurrency]` and `[resources]` settings."""
        where = self.root / "apps" / name
        shutil.copytree(HELLO, where)
        toml = where / "wakeful.toml"
        text = toml.read_text().replace('name = "hello"', f'name = "{name}"')
        resources = {k: v for k, v in settings.items() if k in ("processes", "open_files")}
        for key, value in settings.items():
            if key in resources:
                continue
            lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
            text = "\n".join(lines).replace("[concurrency]", f"[concurrency]\n{key} = {value}")
        if resources:
            text += "\n[resources]\n" + "".join(f"{k} = {v}\n" for k, v in resources.items())
        toml.write_text(text + "\n")
        return where

    def deploy_on(self, node: str, name: str, **settings: object) -> None:
        """Deploy `name` while every other node is cordoned, so its sandboxes land on `node`."""
        others = [n for n in self.nodes if n != node]
        for other in others:
            self.cli("drain", "--no-evacuate", other)
        try:
            self.cli("deploy", str(self.app(name, **settings)))
        finally:
            for other in others:
                self.cli("drain", "--undo", other)

    def get(self, app: str, path: str = "/", timeout: float = 60) -> httpx.Response:
        return httpx.get(self.proxy + path, headers={"Host": f"{app}.localhost"}, timeout=timeout)


@contextlib.contextmanager
def tunnel_cluster(
    root: Path,
    *,
    replicas: int = 2,
    direct_node: bool = True,
    node_env: dict[str, str] | None = None,
    ingress_env: dict[str, str] | None = None,
    tls: tuple[Path, Path, Path] | None = None,
) -> Iterator[TunnelCluster]:
    """The cluster described in the module docstring, torn down on exit. `tls`: (CA,
    certificate, key): nginx terminates TLS for the tunnels, and the node dials `https://`
    trusting that CA (`WAKEFUL_TUNNEL_CA`)."""
    etcd = EtcdServer()
    etcd.start()
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": etcd.url,
        "WAKEFUL_STORE_NAMESPACE": f"/tunnel-{uuid.uuid4().hex[:8]}/",
        "WAKEFUL_TOKEN": ADMIN_TOKEN,
        "WAKEFUL_LEASE_TTL": "5",
        "WAKEFUL_NODE_TTL": "3",
        "WAKEFUL_ARTIFACT_DIR": str(root / "artifacts"),
        "WAKEFUL_SECRETS_KEYS": str(root / "secret-keys"),  # shared, as the artifacts are
    }
    c = TunnelCluster(root, env)
    try:
        listen = f"127.0.0.1:{free_port()}"
        c.api = f"http://{listen}"
        c.activator = Piece(
            "activator",
            "activator",
            [*WAKEFUL, "--data-dir", str(root / "activator"), "activator"],
            {**env, "WAKEFUL_LISTEN": listen, "WAKEFUL_ADVERTISE_URL": c.api},
        )
        c.activator.start()
        piece_env = {k: v for k, v in env.items() if k != "WAKEFUL_TOKEN"} | {"WAKEFUL_API": c.api}
        token = c.cli("tokens", "create", "--role", "ingress", "--name", "edge").strip()
        http_listens, tunnel_listens = [], []
        for number in range(replicas):
            http, admin, tunnel = (f"127.0.0.1:{free_port()}" for _ in range(3))
            http_listens.append(http)
            tunnel_listens.append(tunnel)
            c.replica_admin.append(f"http://{admin}")
            piece = Piece(
                f"ingress{number}",
                "ingress",
                [*WAKEFUL, "ingress"],
                piece_env
                | {
                    "WAKEFUL_LISTEN": http,
                    "WAKEFUL_ADMIN_LISTEN": admin,
                    "WAKEFUL_INGRESS_TOKEN": token,
                    "WAKEFUL_TUNNEL_LISTEN": tunnel,
                    "WAKEFUL_TUNNEL_REPLICA": f"r{number}",
                    "WAKEFUL_UPSTREAM_CONNECTIONS_PER_APP": "4096",
                    "WAKEFUL_UPSTREAM_CONNECTIONS": "8192",
                    **(ingress_env or {}),
                },
            )
            piece.start()
            c.replicas.append(piece)
        http_port, tunnel_port = free_port(), free_port()
        conf = root / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(
                root=root,
                own_files=NGINX_HTTP.format(dir=root),
                http=http_port,
                tunnel=tunnel_port,
                tls=(
                    ""
                    if tls is None
                    else f" ssl;\n        ssl_certificate {tls[1]};\n"
                    f"        ssl_certificate_key {tls[2]}"
                ),
                http_servers="\n".join(f"        server {a} max_fails=0;" for a in http_listens),
                tunnel_servers="\n".join(f"        server {a};" for a in tunnel_listens),
            )
        )
        c.nginx = subprocess.Popen(
            ["nginx", "-p", str(root), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        c.proxy = f"http://127.0.0.1:{http_port}"
        c.tunnel = f"{'https' if tls else 'http'}://127.0.0.1:{tunnel_port}"
        _wait_http(c.proxy)
        names = ["n1", "n2"] if direct_node else ["n1"]
        for number, name in enumerate(names):
            node_token = c.cli("tokens", "create", "--role", "node", "--name", name).strip()
            low = 21000 + 2000 * number
            extra = {
                "WAKEFUL_NODE_NAME": name,
                "WAKEFUL_DATA_DIR": str(root / name),
                "WAKEFUL_NODE_TOKEN": node_token,
                "WAKEFUL_PORT_RANGE": f"[{low}, {low + 1999}]",
            }
            if name == "n1":
                extra |= {"WAKEFUL_TUNNEL": c.tunnel, **(node_env or {})}
                if tls is not None:
                    extra["WAKEFUL_TUNNEL_CA"] = str(tls[0])
            piece = Piece(name, "node", [*WAKEFUL, "node"], piece_env | extra)
            piece.start()
            c.nodes[name] = piece
        deadline = time.monotonic() + 60
        while not c.tunnel_table().get("reachable"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"n1 never held a tunnel stream: {c.node_record()}")
            time.sleep(0.2)
        yield c
    finally:
        if c.nginx is not None:
            c.nginx.terminate()
            c.nginx.wait(timeout=30)
        for piece in [*c.replicas, *c.nodes.values(), *([c.activator] if c.activator else [])]:
            piece.signal(signal.SIGTERM)
        etcd.close()


def _wait_http(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer")
        time.sleep(0.05)


# -- measurements --------------------------------------------------------------------------------


@dataclass
class Rate:
    path: str
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def hey_at_rate(c: TunnelCluster, app: str, rate: int, seconds: int, label: str) -> Rate:
    """`hey` through nginx at `rate` requests per second (10 workers), its figures parsed."""
    workers = 10
    done = subprocess.run(
        [
            "hey",
            "-z",
            f"{seconds}s",
            "-c",
            str(workers),
            "-q",
            str(rate / workers),
            "-host",
            f"{app}.localhost",
            c.proxy + "/",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    out = done.stdout
    if "Latency distribution" not in out:
        raise RuntimeError(f"hey got no answers from {app}: {out[-1500:]}")
    try:
        rps = float(_found(r"Requests/sec:\s+([\d.]+)", out))
        p50 = float(_found(r"50%+ in ([\d.]+) secs", out)) * 1000
        p99 = float(_found(r"99%+ in ([\d.]+) secs", out)) * 1000
    except LookupError:
        raise RuntimeError(f"cannot read hey's figures for {app}: {out[-2000:]}") from None
    codes = dict(re.findall(r"\[(\d{3})\]\s+(\d+) responses", out))
    errors = sum(int(n) for code, n in codes.items() if code != "200")
    return Rate(label, rps, p50, p99, errors)


def _found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    if match is None:
        raise LookupError(pattern)
    return match.group(1)


@dataclass
class Burst:
    calls: int
    sleep: float
    failed: int
    all_in_flight_s: float
    """The longest answer's latency minus the sleep: when the last call got a stream."""
    streams_before: dict[str, int]
    streams_peak: dict[str, int]
    streams_after_prune: dict[str, int]
    relayed: int


def burst(c: TunnelCluster, app: str, calls: int, sleep: float, prune_wait: float) -> Burst:
    """`calls` concurrent `GET /sleep?s=SLEEP` through nginx at a node holding its reserve."""
    before = c.streams_by_replica()
    latencies: list[float] = []
    failures: list[str] = []
    peak: dict[str, int] = dict(before)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                for replica, streams in c.streams_by_replica().items():
                    peak[replica] = max(peak.get(replica, 0), streams)
            stop.wait(0.5)

    def one() -> None:
        started = time.monotonic()
        try:
            answer = c.get(app, f"/sleep?s={sleep}", timeout=120)
            if answer.status_code != 200:
                failures.append(f"{answer.status_code} {answer.text[:200]}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))
        latencies.append(time.monotonic() - started)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=one) for _ in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    relayed = sum(
        _sample(url, "wakeful_ingress_tunnel_requests_total", "relayed") for url in c.replica_admin
    )
    deadline = time.monotonic() + prune_wait
    after = c.streams_by_replica()
    while time.monotonic() < deadline and sum(after.values()) > 2 * len(c.replicas):
        time.sleep(1)
        after = c.streams_by_replica()
    return Burst(
        calls,
        sleep,
        len(failures),
        max(latencies) - sleep,
        before,
        peak,
        after,
        int(relayed),
    )


def _sample(admin: str, name: str, path: str) -> float:
    try:
        text = httpx.get(admin + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return 0.0
    found = re.search(rf'^{name}{{path="{path}"}} ([\d.e+]+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=10.0, help="seconds each burst call takes")
    parser.add_argument("--prune", type=float, default=60.0, help="seconds to wait for pruning")
    args = parser.parse_args()
    for tool in ("nginx", "hey", "etcd"):
        if shutil.which(tool) is None:
            sys.exit(f"bench.tunnel needs {tool}: apt-get install nginx hey etcd-server")
    root = Path(tempfile.mkdtemp(prefix="wakeful-tunnel-bench-"))
    # Pruning shortened so the bench can show it: idle 10 s, at least 5 s old.
    node_env = {"WAKEFUL_TUNNEL_PRUNE_UNUSED": "10", "WAKEFUL_TUNNEL_PRUNE_MIN_AGE": "5"}
    try:
        with tunnel_cluster(root, replicas=args.replicas, node_env=node_env) as c:
            c.deploy_on("n2", "direct", **STEADY)
            c.deploy_on("n1", "tunnelled", **STEADY)
            for app in ("direct", "tunnelled"):
                # One request at a time first, so each replica caches a lease of its own:
                # misses at once would each take a lease, and one replica could end up holding
                # every lease while the other pays an overflow lease per request.
                for _ in range(2 * args.replicas):
                    assert c.get(app).status_code == 200
            hey_at_rate(c, "direct", args.rate, 2, "warm-up")
            hey_at_rate(c, "tunnelled", args.rate, 2, "warm-up")
            rows = [
                hey_at_rate(c, "direct", args.rate, args.seconds, "direct (n2)"),
                hey_at_rate(c, "tunnelled", args.rate, args.seconds, "tunnel (n1)"),
            ]
            print(
                f"\nfixed rate: {args.rate} req/s for {args.seconds} s through nginx, "
                f"{args.replicas} ingress replicas"
            )
            print(f"{'path':<14}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
            for row in rows:
                print(
                    f"{row.path:<14}{row.rps:>9.0f}{row.p50_ms:>9.2f}{row.p99_ms:>9.2f}{row.errors:>8}"
                )
            ratio = rows[1].p50_ms / rows[0].p50_ms
            print(f"tunnel p50 / direct p50 = {ratio:.2f} (goal: at most 2)")
            c.deploy_on(
                "n1",
                "burst",
                min_instances=1,
                max_instances=1,
                requests_per_instance=args.burst,
                processes=args.burst + 256,
                open_files=4 * args.burst + 1024,
            )
            assert c.get("burst").status_code == 200
            time.sleep(2)
            result = burst(c, "burst", args.burst, args.sleep, args.prune)
            print(f"\ncold burst: {result.calls} concurrent calls of {result.sleep:g} s")
            print(f"  failed: {result.failed}")
            print(
                f"  longest wait for a stream (the slowest call's latency - {result.sleep:g} s): "
                f"{result.all_in_flight_s:.2f} s"
            )
            print(f"  streams per replica before: {result.streams_before}")
            print(f"  streams per replica at peak: {result.streams_peak}")
            print(f"  streams per replica after pruning: {result.streams_after_prune}")
            print(f"  requests relayed between replicas: {result.relayed}")
            actions = c.tunnel_table().get("actions")
            print(f"  coverage actions (streams): {actions}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()


_ = statistics  # the module's figures are computed by hey and the burst itself
