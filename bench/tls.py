"""Benchmark full TLS handshakes: the ingress's HTTPS listener with a certificate from ACME (in
memory), the same with it from a `tls_dir` (files), and nginx, all on loopback.

- The certificate: ECDSA P-256, self-signed, made in the run, for `shop.bench`. Each handshake
  is a new connection: TLS 1.3, SNI sent, no session reused, closed after the client's Finished.
- The ingress: `ingress.Ingress` in this process on uvloop, the real `Activator` in-process on
  the memory store. ACME: no `tls_dir`; a `certs/` record in the store and a `CertSource` that
  hands the pair over, so `IssuedFeed` installs it with `Certificates.install_issued`, in
  memory. Files: a `tls_dir` with `shop.bench.*` and `default.*` (the same pair).
- nginx: Debian's, our own process, one worker, TLS 1.3 only, no session cache, session tickets
  on (its default, and what the ingress sends too: OpenSSL's two per handshake).
- The load: `--connections` processes of this module (`--client`), each a loop of blocking
  connect + handshake (Python's `ssl`) + close. Unless `--no-pin`, the server (this process, or
  nginx) runs on the first CPU and the clients on the others: a server near 100% busy is what
  limits the rate. A server's CPU comes from /proc/PID/stat (utime + stime) around the run.

Only loopback. From the repository root (needs `apt-get install nginx`):

    python -m bench.tls [--seconds 5] [--connections 16]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.tls")

import argparse
import contextlib
import functools
import json
import logging
import os
import platform
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry

from bench.harness import nginx_conf, process
from bench.procfs import cpu_seconds, with_children
from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain import keys
from wakeful.domain.models import CertRecord, CertState, Issued
from wakeful.ingress import Ingress, IngressSettings
from wakeful.ingress.acme import ServedPair
from wakeful.process import settle_heap
from wakeful.store.testing import free_port
from wakeful.store.url import open_store

NAME = "shop.bench"
"""What the `certs/` record holds in place of a sealed key: the ingress never opens it."""

NGINX_TLS = """
worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
{http}
    server {{
        listen 127.0.0.1:{port} ssl; server_name shop.bench; return 204;
        ssl_certificate {dir}/certs/shop.bench.crt; ssl_certificate_key {dir}/certs/shop.bench.key;
        ssl_protocols TLSv1.3; ssl_session_cache off; ssl_session_tickets on;
    }}
}}
"""


def make_pair(directory: Path) -> tuple[str, str]:
    """A P-256 certificate for NAME and its key (PEM), also written as `NAME.*` and
    `default.*` in `directory` (a `tls_dir`)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    chain = cert.public_bytes(Encoding.PEM).decode()
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    for host in (NAME, "default"):
        (directory / f"{host}.crt").write_text(chain)
        (directory / f"{host}.key").write_text(key_pem)
    return chain, key_pem


# -- the load (each client a subprocess) ------------------------------------------------------


def run_client(cert: Path, cpus: set[int]) -> None:
    """Per line `PORT END` on stdin: new connection, handshake, close, until the monotonic
    clock (one for the whole machine) reaches END; then one JSON line of counts."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    expected = ssl.PEM_cert_to_DER_cert(cert.read_text())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the server's signature is still checked
    print("ready", flush=True)
    for line in sys.stdin:
        port, end = int(line.split()[0]), float(line.split()[1])
        count, errors, first, cpu = 0, 0, "", time.process_time()
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    with context.wrap_socket(raw, server_hostname=NAME) as tls:
                        if not count and tls.getpeercert(binary_form=True) != expected:
                            raise ssl.SSLError("not the benchmark's certificate")
                count += 1
            except OSError as exc:
                errors, first = errors + 1, first or repr(exc)
        cpu = time.process_time() - cpu
        print(json.dumps({"count": count, "errors": errors, "first": first, "cpu": cpu}))
        sys.stdout.flush()


@dataclass
class Result:
    rate: float
    errors: int
    first_error: str
    server_us: float  # CPU µs per handshake
    server_busy: float  # CPU seconds per second
    client_us: float
    client_cores: float


class Load:
    """The client processes, started once and given one target after another."""

    def __init__(self, procs: list[Process]) -> None:
        self.procs = procs
        self.readers = [BufferedByteReceiveStream(p.stdout) for p in procs if p.stdout]

    async def line(self, reader: BufferedByteReceiveStream) -> str:
        return (await reader.receive_until(b"\n", 1 << 16)).decode()

    async def run(self, port: int, seconds: float, server_cpu: Callable[[], float]) -> Result:
        cpu, start = server_cpu(), time.monotonic()
        for proc in self.procs:
            assert proc.stdin is not None
            await proc.stdin.send(f"{port} {start + seconds}\n".encode())
        done = [json.loads(await self.line(reader)) for reader in self.readers]
        wall, cpu = time.monotonic() - start, server_cpu() - cpu
        count = sum(d["count"] for d in done)
        client = sum(d["cpu"] for d in done)
        return Result(
            rate=count / seconds,
            errors=sum(d["errors"] for d in done),
            first_error=next((d["first"] for d in done if d["first"]), ""),
            server_us=cpu / max(count, 1) * 1e6,
            server_busy=cpu / wall,
            client_us=client / max(count, 1) * 1e6,
            client_cores=client / wall,
        )

    async def measure(
        self, name: str, port: int, seconds: float, cpu: Callable[[], float]
    ) -> Result:
        print(f"  {name}: warm-up 1s, then {seconds}s ...", flush=True)
        await self.run(port, 1.0, cpu)
        return await self.run(port, seconds, cpu)


@contextlib.asynccontextmanager
async def clients(n: int, cert: Path, cpus: list[int]) -> AsyncIterator[Load]:
    args = [sys.executable, "-m", "bench.tls", "--client", str(cert)]
    args += ["--cpus", ",".join(map(str, cpus))]
    procs: list[Process] = []
    try:
        for _ in range(n):
            procs.append(await anyio.open_process(args, stderr=None))
        load = Load(procs)
        for reader in load.readers:
            assert (await load.line(reader)).strip() == "ready"
        yield load
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        with anyio.CancelScope(shield=True):
            for proc in procs:
                await proc.wait()


def tree_cpu(pid: int) -> Callable[[], float]:
    """The CPU of `pid` and its children (nginx's master and its worker)."""
    pids = with_children(pid)
    return lambda: cpu_seconds(*pids)


# -- the ingress ---------------------------------------------------------------------------------


@dataclass
class Handed:
    """The control plane's side of `CertSource`: every certificate with its key."""

    pairs: list[ServedPair]

    async def served(self) -> list[ServedPair]:
        return self.pairs


@contextlib.asynccontextmanager
async def ingress_tls(tls_dir: Path | None, pair: ServedPair | None) -> AsyncIterator[int]:
    """`bench.harness.serving` with a TLS listener: certificates from `tls_dir`, or `pair`
    issued by ACME (a `certs/` record, then the feed installs it). Yields its TLS port."""
    async with open_store("memory://") as store:
        registry = CollectorRegistry()
        config = ActivatorSettings(store_url="memory://", token="bench")
        activator = Activator(store, config, registry)
        settings = IngressSettings(
            store_url="memory://",
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            tls_listen=f"127.0.0.1:{free_port()}",
            tls_dir=tls_dir,
        )
        certs = Handed([pair]) if pair is not None else None
        ingress = Ingress(settings, InProcessLeases(activator), store, registry, certs=certs)
        async with activator.running(), ingress.running():
            if pair is not None:
                issued = Issued(chain="-", not_before=0, not_after=2e9, issuer="-", serial="1")
                record = CertRecord(name=NAME, state=CertState.VALID, issued=issued)
                await store.put(keys.cert(NAME), record)
                for _ in range(1000):  # the feed fetches and installs it
                    if ingress.issued is not None and NAME in ingress.issued.installed:
                        break
                    await anyio.sleep(0.01)
            assert ingress.certificates is not None and NAME in ingress.certificates.hosts()
            settle_heap()
            yield ingress.tls_address[1]


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "")
    nginx = subprocess.run(["nginx", "-V"], capture_output=True, text=True).stderr.splitlines()
    return (
        f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}\n"
        f"Python {platform.python_version()} with {ssl.OPENSSL_VERSION}\n"
        f"{nginx[0]}, {nginx[1]}"
    )


async def main(seconds: int, connections: int, client_cpus: list[int]) -> None:
    if shutil.which("nginx") is None:
        sys.exit("missing nginx: apt-get install nginx")
    print(machine())
    print(f"command: {sys.executable} -m bench.tls {' '.join(sys.argv[1:])}".rstrip())
    server = sorted(os.sched_getaffinity(0))
    print(
        f"load: {connections} client processes (Python ssl, blocking), each a loop of connect, "
        f"TLS 1.3 handshake (SNI {NAME}, no resumption), close; {seconds}s per target after "
        f"1s of warm-up; servers on CPUs {server}, clients on CPUs {client_cpus or 'any'}"
    )
    results: dict[str, Result] = {}
    own = functools.partial(cpu_seconds, os.getpid())
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp:
        certs = Path(tmp) / "certs"
        certs.mkdir()
        chain, key = make_pair(certs)
        acme = ServedPair(NAME, chain, key, "1")
        async with clients(connections, certs / f"{NAME}.crt", client_cpus) as load:
            ingresses = (("ingress ACME (memory)", None, acme), ("ingress files", certs, None))
            for name, tls_dir, pair in ingresses:
                async with ingress_tls(tls_dir, pair) as port:
                    results[name] = await load.measure(name, port, seconds, own)
            port = free_port()
            conf = Path(tmp) / "nginx.conf"
            conf.write_text(nginx_conf(NGINX_TLS, tmp, port=port))
            with process(["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"], port) as ngx:
                results["nginx"] = await load.measure("nginx", port, seconds, tree_cpu(ngx.pid))

    print(f"\n{'':<24}    hs/s errors  server: µs/hs  busy  1-core  clients: µs/hs cores")
    for name, r in results.items():
        print(
            f"{name:<24} {r.rate:>7,.0f} {r.errors:>6}  {r.server_us:>13.0f} {r.server_busy:>5.0%} "
            f"{1e6 / r.server_us:>7,.0f}  {r.client_us:>14.0f} {r.client_cores:>5.2f}"
        )
    print("(1-core: the handshakes/s the server's CPU per handshake allows on a core of its own)")
    nginx = results.pop("nginx")
    for name, r in results.items():
        print(
            f"{name} / nginx: handshakes/s {r.rate / nginx.rate:.2f}, "
            f"1-core capacity {nginx.server_us / r.server_us:.2f} "
            f"(CPU per handshake {r.server_us / nginx.server_us:.2f}x nginx's)"
        )
    for name, r in [*results.items(), ("nginx", nginx)]:
        if r.errors:
            print(f"{name}: {r.errors} failed handshakes, the first: {r.first_error}")
        if r.server_busy < 0.9:
            print(f"{name}: the server was {r.server_busy:.0%} busy: the clients set the rate")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16, help="client processes")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--client", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args.client, {int(cpu) for cpu in args.cpus.split(",") if cpu})
    else:
        logging.basicConfig(level=logging.WARNING)
        cpus = sorted(os.sched_getaffinity(0))
        if args.pin and len(cpus) > 1:  # this thread (the ingress's loop) and what it starts
            os.sched_setaffinity(0, cpus[:1])
        clients_on = cpus[1:] if args.pin else []
        anyio.run(
            main, args.seconds, args.connections, clients_on, backend_options={"use_uvloop": True}
        )
