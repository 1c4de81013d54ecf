"""The fault suite's cluster (`bench/faults.py`), and what other benches take from it: a piece
(`Piece`, one `wakeful` process of the multi-process mode, its output kept and its
leadership changes counted) and the CLI run against a control API (`wakeful_cli`).

The cluster: three etcd members, two activators (one leads), two nodes, two ingresses behind
Debian's nginx, every piece a `wakeful` process of its own (`cluster`), and what is left
under its directory once it stopped (`left_behind`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from wakeful.store.testing import EtcdCluster, free_port

WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
HELLO = Path(__file__).parents[1] / "examples" / "hello"
ADMIN_TOKEN = "faults-admin-token"
MAX_WAITERS = 20
LEASE_IDLE_TTL = 2.0


# -- the cluster ------------------------------------------------------------------------------


def wakeful_cli(env: dict[str, str], api: str, *args: str, check: bool = True) -> str:
    """`wakeful ARGS` against the control API at `api` with `env`; its output, or
    RuntimeError with what it said when it failed (`check`)."""
    done = subprocess.run(
        [*WAKEFUL, *args],
        env={**env, "WAKEFUL_API": api},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and done.returncode:
        raise RuntimeError(f"wakeful {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


class Piece:
    """One `wakeful` process, started again with the same command after a fault."""

    def __init__(
        self, name: str, role: str, argv: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> None:
        """`cwd`: where it runs (`python -m wakeful.cli` imports the `wakeful` found there)."""
        self.name = name
        self.role = role
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.process: subprocess.Popen[str] | None = None
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        self.events: collections.Counter[str] = collections.Counter()
        """Lines of its output naming a leadership change, counted by `EVENTS` entry."""

    def start(self) -> None:
        process = self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert process.stdout is not None
        while True:  # each piece prints a line starting with its role once it serves
            line = process.stdout.readline()
            if not line:
                output = "\n".join(self.output)
                raise RuntimeError(f"{self.name} did not start: {output[-3000:]}")
            self.output.append(line.rstrip())
            if line.startswith(self.role + " "):
                break
        # Read the rest all along: a full pipe would stop the piece.
        threading.Thread(target=self._drain, args=(process,), daemon=True).start()

    def _drain(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with process.stdout:  # closed at the end of the output, when the process ended
            for line in process.stdout:
                self.output.append(line.rstrip())
                for label, text in EVENTS.items():
                    if text in line:
                        self.events[label] += 1

    def signal(self, signum: int) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


EVENTS = {
    "elected": "elected",
    "resumed its term": "resumed the term",
    "stepped down": "stopped leading:",
}
"""What an activator's output says when its leadership changes: label, then the text."""


def leadership(c: Cluster) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for piece in c.activators:
        total.update(piece.events)
    return total


NGINX_CONF = """
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    upstream ingresses {{
        server {a} max_fails=0;
        server {b} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://ingresses;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_next_upstream error timeout;
            proxy_read_timeout 120s;
        }}
    }}
}}
"""


def leads(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Cluster:
    root: Path
    etcd: EtcdCluster
    env: dict[str, str]
    activators: list[Piece] = field(default_factory=list)
    activator_urls: list[str] = field(default_factory=list)
    nodes: list[Piece] = field(default_factory=list)
    ingresses: list[Piece] = field(default_factory=list)
    ingress_admin: list[str] = field(default_factory=list)
    nginx: subprocess.Popen[bytes] | None = None
    proxy: str = ""
    apps: int = 0

    def admin(self, method: str, path: str) -> httpx.Response:
        """A control API call on whichever activator leads."""
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        failed: Exception | None = None
        for url in self.activator_urls:
            try:
                answer = httpx.request(method, url + path, headers=headers, timeout=30)
            except httpx.HTTPError as exc:
                failed = exc
                continue
            if answer.status_code == 503 and "standby" in answer.text:
                continue
            return answer
        raise RuntimeError(f"no activator leads: {failed}")

    def leader(self) -> Piece | None:
        for piece, url in zip(self.activators, self.activator_urls, strict=True):
            if leads(url):
                return piece
        return None

    def cli(self, *args: str) -> str:
        return wakeful_cli(self.env, ",".join(self.activator_urls), *args)

    def app(self, name: str, **concurrency: object) -> Path:
        """The sample app under `name`, its concurrency settings changed."""
        where = self.root / "apps" / name
        shutil.copytree(HELLO, where)
        toml = where / "wakeful.toml"
        text = toml.read_text().replace('name = "hello"', f'name = "{name}"')
        for key, value in concurrency.items():
            lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
            text = "\n".join(lines).replace("[concurrency]", f"[concurrency]\n{key} = {value}")
        toml.write_text(text + "\n")
        return where

    def cold_app(self, **concurrency: object) -> str:
        self.apps += 1
        name = f"cold{self.apps}"
        self.cli("deploy", str(self.app(name, **concurrency)))
        return name

    def pools(self) -> list[dict[str, object]]:
        answer = self.admin("GET", "/v1/pools")
        answer.raise_for_status()
        found: list[dict[str, object]] = answer.json()
        return found

    def rss_kib(self, piece: Piece) -> int:
        assert piece.process is not None
        status = Path(f"/proc/{piece.process.pid}/status").read_text()
        return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS")))


@contextlib.contextmanager
def cluster(root: Path) -> Iterator[Cluster]:
    etcd = EtcdCluster(3)
    etcd.start()
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": etcd.url,
        "WAKEFUL_STORE_NAMESPACE": f"/faults-{uuid.uuid4().hex[:8]}/",
        "WAKEFUL_TOKEN": ADMIN_TOKEN,
        "WAKEFUL_LEASE_TTL": "5",
        "WAKEFUL_ELECTION_TTL": "2",
        "WAKEFUL_ADOPT_WINDOW": "1",
        "WAKEFUL_MAX_WAITERS": str(MAX_WAITERS),
        "WAKEFUL_LEASE_IDLE_TTL": str(LEASE_IDLE_TTL),
        "WAKEFUL_NODE_TTL": "3",
        "WAKEFUL_ARTIFACT_DIR": str(root / "artifacts"),
        "WAKEFUL_SECRETS_KEYS": str(root / "secret-keys"),  # shared, as the artifacts are
    }
    c = Cluster(root, etcd, env)
    try:
        for number in range(2):
            listen = f"127.0.0.1:{free_port()}"
            c.activator_urls.append(f"http://{listen}")
            c.activators.append(
                Piece(
                    f"activator{number}",
                    "activator",
                    [*WAKEFUL, "-v", "--data-dir", str(root / f"activator{number}"), "activator"],
                    {**env, "WAKEFUL_LISTEN": listen, "WAKEFUL_ADVERTISE_URL": f"http://{listen}"},
                )
            )
            c.activators[-1].start()
        every = ",".join(c.activator_urls)
        piece_env = {k: v for k, v in env.items() if k != "WAKEFUL_TOKEN"} | {"WAKEFUL_API": every}
        for number in range(2):
            name = f"n{number + 1}"
            token = c.cli("tokens", "create", "--role", "node", "--name", name).strip()
            low = 21000 + 2000 * number
            c.nodes.append(
                Piece(
                    name,
                    "node",
                    [*WAKEFUL, "node"],
                    piece_env
                    | {
                        "WAKEFUL_NODE_NAME": name,
                        "WAKEFUL_DATA_DIR": str(root / name),
                        "WAKEFUL_NODE_TOKEN": token,
                        "WAKEFUL_PORT_RANGE": f"[{low}, {low + 1999}]",
                    },
                )
            )
            c.nodes[-1].start()
        token = c.cli("tokens", "create", "--role", "ingress", "--name", "edge").strip()
        listens = []
        for number in range(2):
            listen, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            listens.append(listen)
            c.ingress_admin.append(f"http://{admin}")
            c.ingresses.append(
                Piece(
                    f"ingress{number}",
                    "ingress",
                    [*WAKEFUL, "ingress"],
                    piece_env
                    | {
                        "WAKEFUL_LISTEN": listen,
                        "WAKEFUL_ADMIN_LISTEN": admin,
                        "WAKEFUL_INGRESS_TOKEN": token,
                    },
                )
            )
            c.ingresses[-1].start()
        port = free_port()
        conf = root / "nginx.conf"
        conf.write_text(NGINX_CONF.format(root=root, a=listens[0], b=listens[1], port=port))
        c.nginx = subprocess.Popen(
            ["nginx", "-p", str(root), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        c.proxy = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(c.proxy, timeout=1)
                break
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not start")
            time.sleep(0.05)
        c.cli("deploy", str(c.app("warm", min_instances=2)))
        yield c
    finally:
        if c.nginx is not None:
            c.nginx.terminate()
            c.nginx.wait(timeout=30)
        for piece in [*c.ingresses, *c.nodes, *reversed(c.activators)]:
            piece.signal(signal.SIGTERM)
        etcd.close()


def left_behind(root: Path) -> list[str]:
    """Processes still running from the cluster's directory (pieces, sandboxes, nginx)."""
    found = []
    needle = str(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if needle in command or cwd.startswith(needle):
            found.append(f"{entry.name} {command[:120]}")
    return found
