"""A real etcd server for tests and benchmarks: loopback, a free port, a temporary data dir.

`EtcdServer` starts Debian's `etcd` binary, waits for `/health`, and stops it by its process
id. `kill()` and `start()` again on the same data directory simulate a crash and restart.
Given `EtcdServerTLS`, it serves https only and requires client certificates.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

_HANDED: collections.deque[int] = collections.deque(maxlen=256)
"""The ports `free_port` handed out lately in this process."""


def free_port() -> int:
    """A loopback port free now. Never one handed out in the last 256 calls: the kernel, asked
    again, may give the same free port twice (`api, proxy = free_port(), free_port()` once gave
    a control API and an ingress one port, and the ingress's requests went to the API)."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED:
            _HANDED.append(port)
            return port
    raise RuntimeError("no free loopback port that was not handed out lately")


def wait_listening(port: int, within: float = 10.0) -> None:
    """Block until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + within
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class EtcdNotInstalled(RuntimeError):
    pass


@dataclass(frozen=True)
class EtcdServerTLS:
    """PEM files for an etcd that serves only mutual TLS: its certificate and key, the CA
    whose client certificates it accepts (`--client-cert-auth --trusted-ca-file`), and one
    such client certificate, for the health check."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def flags(self) -> list[str]:
        return [
            f"--cert-file={self.cert}",
            f"--key-file={self.key}",
            "--client-cert-auth",
            f"--trusted-ca-file={self.ca}",
        ]

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(self.client_cert, self.client_key)
        return context


class EtcdServer:
    def __init__(
        self,
        binary: str | None = None,
        *,
        tls: EtcdServerTLS | None = None,
        name: str = "wakeful-test",
        peer_port: int | None = None,
        initial_cluster: str | None = None,
    ) -> None:
        """`name`, `peer_port` and `initial_cluster`: a member of a cluster (`EtcdCluster`);
        alone by default."""
        found = binary or shutil.which("etcd")
        if found is None:
            raise EtcdNotInstalled(
                "etcd is not on the PATH: install Debian's etcd-server (scripts/test installs it)"
            )
        self.binary = found
        self.data_dir = Path(tempfile.mkdtemp(prefix="wakeful-etcd-"))
        self.client_port = free_port()
        self.peer_port = peer_port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.tls = tls
        self.name = name
        self.initial_cluster = initial_cluster

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.endpoint}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def start(self, timeout: float = 30.0) -> None:
        self.spawn()
        self.wait_healthy(timeout)

    def spawn(self) -> None:
        """Start the process, without waiting for it to serve (a cluster's members wait for
        each other)."""
        client = self.client_url
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = (self.data_dir / "etcd.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--name={self.name}",
                f"--data-dir={self.data_dir / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={self.initial_cluster or f'{self.name}={peer}'}",
                "--log-level=error",
                *(self.tls.flags() if self.tls else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def wait_healthy(self, timeout: float = 30.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited at start: {self.log_tail()}")
            if self._healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy in {timeout} s: {self.log_tail()}")

    def _healthy(self) -> bool:
        context = self.tls.client_context() if self.tls else None
        try:
            url = f"{self.client_url}/health"
            with urllib.request.urlopen(url, timeout=1, context=context) as answer:
                return bool(json.load(answer).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        path = self.data_dir / "etcd.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, as a crash would: no clean shutdown."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EtcdCluster:
    """`size` etcd members on loopback, each `EtcdServer`; `url` names them all. Kill one
    (`members[i].kill()`) and start it again (`members[i].start()`) to lose and regain a
    member while the others keep the quorum."""

    def __init__(self, size: int = 3) -> None:
        peers = [free_port() for _ in range(size)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{port}" for i, port in enumerate(peers))
        self.members = [
            EtcdServer(name=f"m{i}", peer_port=port, initial_cluster=cluster)
            for i, port in enumerate(peers)
        ]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(member.endpoint for member in self.members)

    def start(self, timeout: float = 60.0) -> None:
        """Every member up and healthy, or none left running (a member that never becomes
        healthy stops the ones already started: a failed start leaks no etcd)."""
        try:
            for member in self.members:
                member.spawn()
            for member in self.members:
                member.wait_healthy(timeout)
        except BaseException:
            self.close()
            raise

    def leader(self, within: float = 15.0) -> EtcdServer:
        """The member the others follow now (from each member's /v3/maintenance/status),
        waiting up to `within` seconds for one to be elected."""
        deadline = time.monotonic() + within
        while True:
            found = self._leader()
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise RuntimeError("no etcd member leads")
            time.sleep(0.1)

    def _leader(self) -> EtcdServer | None:
        for member in self.members:
            if member.process is None:
                continue
            try:
                request = urllib.request.Request(
                    f"{member.client_url}/v3/maintenance/status", data=b"{}", method="POST"
                )
                with urllib.request.urlopen(request, timeout=2) as answer:
                    status = json.load(answer)
            except (OSError, urllib.error.URLError, ValueError):
                continue
            header = status.get("header", {})
            if str(status.get("leader")) == str(header.get("member_id")):
                return member
        return None

    def close(self) -> None:
        for member in self.members:
            member.close()
