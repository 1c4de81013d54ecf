"""A real etcd server for tests and benchmarks: loopback, a free port, a temporary data dir.

`EtcdServer` starts Debian's `etcd` binary, waits for `/health`, and stops it by its process
id. `kill()` and `start()` again on the same data directory simulate a crash and restart.
Given `EtcdServerTLS`, it serves https only and requires client certificates.
"""

from __future__ import annotations

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    def __init__(self, binary: str | None = None, *, tls: EtcdServerTLS | None = None) -> None:
        found = binary or shutil.which("etcd")
        if found is None:
            raise EtcdNotInstalled(
                "etcd is not on the PATH: install Debian's etcd-server (scripts/test installs it)"
            )
        self.binary = found
        self.data_dir = Path(tempfile.mkdtemp(prefix="wakeful-etcd-"))
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.tls = tls

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
        client = self.client_url
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = (self.data_dir / "etcd.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--name=wakeful-test",
                f"--data-dir={self.data_dir / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=wakeful-test={peer}",
                "--log-level=error",
                *(self.tls.flags() if self.tls else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
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
