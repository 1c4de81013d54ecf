"""What the benchmarks share: the trivial sandbox they drive (run as `python -m bench.proxy
--sandbox PORT`), subprocesses started and stopped around a block, nginx's configuration
pieces, wrk and hey run and read, and the ingress with the real activator in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import anyio
from prometheus_client import CollectorRegistry

from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.ingress import Ingress, IngressSettings
from wakeful.process import settle_heap
from wakeful.store import Store
from wakeful.store.testing import wait_listening
from wakeful.store.url import open_store

HOST = "bench.localhost"
FLOORS = {"floor": [], "floor+rules": ["--rules"]}
"""`bench.floor` bare, and with the ingress's header rules: each a path measured."""
CONNECTIONS = 32
HEY_WORKERS = 10
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


# -- the trivial sandbox (a subprocess) ------------------------------------------------------


class _Responder(asyncio.Protocol):
    """Answers each request head with RESPONSE, `delay` seconds after it came; requests here
    never carry bodies."""

    def __init__(self, delay: float) -> None:
        self._delay = delay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        answers = self._buffer.count(b"\r\n\r\n")
        if answers:
            self._buffer = self._buffer[self._buffer.rfind(b"\r\n\r\n") + 4 :]
            if self._delay:
                loop = asyncio.get_running_loop()
                loop.call_later(self._delay, self._answer, answers)
            else:
                self._answer(answers)

    def _answer(self, answers: int) -> None:
        if not self._transport.is_closing():
            self._transport.write(RESPONSE * answers)


def run_sandbox(port: int, delay: float = 0.0) -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Responder(delay), "127.0.0.1", port, backlog=4096
        )
        async with server:
            await server.serve_forever()

    uvloop.run(main())


# -- helpers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def process(
    args: list[str], port: int, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`args` running until the block ends, once something listens on `port`."""
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=None if env is None else {**os.environ, **env},
    )
    try:
        wait_listening(port, within=30)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


NGINX_HTTP = """\
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
"""
"""nginx as our own process in a temporary directory: no access log, its temp files there."""


NGINX_KEEPALIVE = 256
"""nginx's idle upstream connections a worker keeps (`keepalive`): the ingress's own bound
(`MAX_IDLE_PER_SANDBOX`). With nginx's usual 64, the 200-connection bursts made nginx open and
close some 136 upstream connections a burst (72 a worker with two), which the ingress keeps:
its CPU and the sandbox's went on connecting, and the ingress looked faster than it is."""


def nginx_conf(template: str, directory: str, **ports: int) -> str:
    """`template` (a config with `{dir}`, `{http}`, `{keepalive}` and ports) filled in for
    `directory`."""
    http = NGINX_HTTP.format(dir=directory)
    return template.format(dir=directory, http=http, keepalive=NGINX_KEEPALIVE, **ports)


NGINX_HEAD = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
"""
"""The start of every bench's nginx configuration: one worker, files in `{dir}`."""

NGINX_TO_SANDBOX = """\
        location / {{
            proxy_pass http://sandbox;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
        }}
"""
"""Every request to the `sandbox` upstream over kept HTTP/1.1 connections, as the ingress."""

NGINX_CONF = (
    NGINX_HEAD
    + """http {{
{http}
    upstream sandbox {{ server 127.0.0.1:{upstream}; keepalive {keepalive}; }}
    server {{
        listen 127.0.0.1:{port};
"""
    + NGINX_TO_SANDBOX
    + """    }}
}}
"""
)


@dataclass
class Result:
    rps: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    errors: str = ""
    cpu_us: float = 0.0
    """The proxy's CPU time per request (user + system, from /proc), when measured."""
    cpu_new_us: float = 0.0
    """The same with a new connection for each request (`Connection: close`), when measured."""
    user_us: float = 0.0
    """Of `cpu_us`, the user time (the proxy's own code, not the kernel's), when measured."""


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


async def run_wrk(
    url: str,
    seconds: int,
    host: str = HOST,
    script: Path | None = None,
    connections: int = CONNECTIONS,
    close: bool = False,
) -> Result:
    """wrk on `url` with `Host: host`, or with a Lua `script` that makes the requests;
    `close`: each request on a new connection, which the server closes after its answer."""
    chosen = ["-s", str(script)] if script is not None else ["-H", f"Host: {host}"]
    if close:
        chosen += ["-H", "Connection: close"]
    done = await anyio.run_process(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", *chosen, url],
        check=False,
    )
    return parse_wrk(done.stdout.decode())


def parse_wrk(out: str) -> Result:
    result = Result()
    if found := re.search(r"Requests/sec:\s+([\d.]+)", out):
        result.rps = float(found.group(1))
    for pct, attr in (("50", "p50_ms"), ("99", "p99_ms")):
        if found := re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
            setattr(result, attr, _ms(found.group(1), found.group(2)))
    if found := re.search(r"^p95_us (\d+)$", out, re.M):  # printed by a script's `done`
        result.p95_ms = int(found.group(1)) / 1000
    if found := re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out):
        result.errors = found.group(0)
    return result


async def run_hey(
    url: str,
    seconds: int,
    rate: int,
    workers: int = HEY_WORKERS,
    host: str = HOST,
    close: bool = False,
) -> Result:
    """hey at `rate` in all; `close`: each request on a new connection."""
    per_worker = max(1, rate // workers)
    args = ["-z", f"{seconds}s", "-c", str(workers), "-q", str(per_worker), "-host", host]
    if close:
        args.append("-disable-keepalive")
    done = await anyio.run_process(["hey", *args, url], check=False)
    out = done.stdout.decode()
    result = Result()
    if found := re.search(r"Requests/sec:\s+([\d.]+)", out):
        result.rps = float(found.group(1))
    for pct, attr in (("50", "p50_ms"), ("95", "p95_ms"), ("99", "p99_ms")):
        if found := re.search(rf"{pct}% in ([\d.]+) secs", out):
            setattr(result, attr, float(found.group(1)) * 1000)
    codes = re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)
    bad = [f"{code}x{n}" for code, n in codes if not code.startswith("2")]
    result.errors = " ".join(bad)
    return result


async def seed(store: Store, sandbox_port: int) -> None:
    spec = AppSpec(
        command=["bench"],
        concurrency=Concurrency(requests_per_instance=1000, max_instances=1),
    )
    await store.put("apps/bench", App(name="bench", active_version="v1"))
    await store.put(
        "pools/bench-v1",
        Pool(name="bench-v1", app="bench", version="v1", spec=spec, desired_instances=1),
    )
    await store.put(
        "sandboxes/sb-1",
        Sandbox(
            id="sb-1",
            pool="bench-v1",
            app="bench",
            node="n1",
            status=SandboxStatus.RUNNING,
            ready=True,
            address=f"127.0.0.1:{sandbox_port}",
        ),
    )


@contextlib.asynccontextmanager
async def ingress_on(sandbox_port: int, direct_path: bool = True) -> AsyncIterator[str]:
    """`direct_path`: as the ingress's setting (`ingress.direct`): off, every request goes the
    general path."""
    async with open_store("memory://") as store:
        await seed(store, sandbox_port)
        async with serving(store, direct_path) as ingress:
            yield "http://{}:{}/".format(*ingress.address)


@contextlib.asynccontextmanager
async def serving(store: Store, direct_path: bool = True) -> AsyncIterator[Ingress]:
    """The real activator (in-process leases) and an ingress on loopback, over `store`."""
    registry = CollectorRegistry()
    activator = Activator(store, ActivatorSettings(store_url="memory://", token="bench"), registry)
    settings = IngressSettings(
        store_url="memory://",
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        direct_path=direct_path,
    )
    ingress = Ingress(settings, InProcessLeases(activator), store, registry)
    async with activator.running(), ingress.running():
        settle_heap()  # as `wakeful up` and `wakeful ingress` do once they are up
        yield ingress


SLOW_DELAY = 0.1
SLOW_WORKERS = 200
"""Enough workers that a 100 ms answer each still makes the rate: 1000 req/s needs 100 in
flight."""
