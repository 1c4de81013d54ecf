"""Benchmark the proxy path: one trivial sandbox driven directly, through the ingress, and
through nginx, with wrk (peak throughput) and hey (latency at a fixed rate).

- The sandbox: a minimal HTTP/1.1 responder on raw asyncio + uvloop (this module run with
  `--sandbox PORT`, a subprocess): it answers every request with a 2-byte body, keep-alive.
  The stdlib hello app is far too slow to be the thing measured against.
- The ingress: `ingress.Ingress` in this process on uvloop with httptools, the real
  `Activator` in-process (`InProcessLeases`) on the memory store; app `bench` with one
  running sandbox and a large `requests_per_instance`, so one cached lease carries the load.
- nginx: Debian's nginx as our own process (one worker, like the single-process ingress),
  generated config, upstream keep-alive, access log off.
- The floor (`bench/floor.py`, a subprocess): the least a proxy on the ingress's own stack
  (Python, uvloop, httptools) does, none of the ingress's work. What the ingress costs above
  it is its own code's; what the floor costs above nginx, the stack's. `floor+rules` is the
  same with five of the ingress's compiled header rules on both heads: roughly what those
  cost (`bench/floor.py` says how roughly). `bench/ladder.py` sets the four side by side.
- wrk: 1 thread, 32 connections; then, for each proxy, again with a new
  connection for each request (`Connection: close`: what a client that opens one per
  request costs, a script's, a health check's). hey: 10 workers at a fixed total rate
  (`--rate`), the proxies' CPU per request meanwhile, then again with a new connection for
  each request (`-disable-keepalive`): at the same rate the peers of both proxies sleep and
  are woken as often, which each one's own peak does not give (in a VM a wake-up is an
  interrupt through the hypervisor, and the slower proxy's peers sleep more).
- Then a sandbox that answers after 100 ms, at the same rate on 200 connections (enough to
  keep 100 requests in flight), in two shapes: hey (its workers fire together: bursts of 200)
  and wrk paced by a random think time (arrivals spread out): p95 direct, through nginx, the
  floor and the ingress.
- A node agent's firewall (the nftables table of `wakeful/node/jail/network.py`) turns on
  connection tracking for every packet of the machine; nginx, whose cost per request is mostly
  the kernel's, loses more to it than the ingress does. Compare runs on the same footing
  (`nft list tables`).

Only loopback. From the repository root (needs `apt-get install nginx wrk hey`):

    python -m bench.proxy [--seconds 10] [--rate 1000]
    python -m bench.proxy --split [--seconds 10] [--runs 3]  # a split's cost (bench/split.py)
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.proxy")

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import anyio
from prometheus_client import CollectorRegistry

from bench.procfs import cpu_seconds, user_seconds, with_children
from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.ingress import Ingress, IngressSettings
from wakeful.process import settle_heap
from wakeful.store import Store
from wakeful.store.testing import free_port, wait_listening
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
async def ingress_on(sandbox_port: int) -> AsyncIterator[str]:
    async with open_store("memory://") as store:
        await seed(store, sandbox_port)
        async with serving(store) as ingress:
            yield "http://{}:{}/".format(*ingress.address)


@contextlib.asynccontextmanager
async def serving(store: Store) -> AsyncIterator[Ingress]:
    """The real activator (in-process leases) and an ingress on loopback, over `store`."""
    registry = CollectorRegistry()
    activator = Activator(store, ActivatorSettings(store_url="memory://", token="bench"), registry)
    settings = IngressSettings(
        store_url="memory://", listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
    )
    ingress = Ingress(settings, InProcessLeases(activator), store, registry)
    async with activator.running(), ingress.running():
        settle_heap()  # as `wakeful up` and `wakeful ingress` do once they are up
        yield ingress


async def measure(
    name: str, url: str, seconds: int, rate: int, pids: Sequence[int] = ()
) -> tuple[Result, Result]:
    """wrk (peak; with `pids`, their CPU time per request meanwhile, and again with a new
    connection for each request), then hey at `rate` (with `pids`, its CPU time per request
    too, and again with a new connection for each: at one rate, the peers of both proxies
    are woken as often, which a figure at each one's peak does not give)."""
    print(f"  {name}: wrk {seconds}s ...", flush=True)
    before, user = cpu_seconds(*pids), user_seconds(*pids)
    peak = await run_wrk(url, seconds)
    if pids and peak.rps:
        peak.cpu_us = (cpu_seconds(*pids) - before) / (peak.rps * seconds) * 1e6
        peak.user_us = (user_seconds(*pids) - user) / (peak.rps * seconds) * 1e6
        print(f"  {name}: wrk {seconds}s, a new connection each request ...", flush=True)
        before = cpu_seconds(*pids)
        new = await run_wrk(url, seconds, close=True)
        if new.rps:
            peak.cpu_new_us = (cpu_seconds(*pids) - before) / (new.rps * seconds) * 1e6
        if new.errors:  # connections refused or reset would flatter the figure: said
            print(f"  {name}: a new connection each request: {new.errors}", flush=True)
    print(f"  {name}: hey {seconds}s at {rate} req/s ...", flush=True)
    before = cpu_seconds(*pids)
    latency = await run_hey(url, seconds, rate)
    if pids and latency.rps:
        latency.cpu_us = (cpu_seconds(*pids) - before) / (latency.rps * seconds) * 1e6
        print(f"  {name}: hey {seconds}s at {rate} req/s, a new connection each ...", flush=True)
        before = cpu_seconds(*pids)
        new = await run_hey(url, seconds, rate, close=True)
        if new.rps:
            latency.cpu_new_us = (cpu_seconds(*pids) - before) / (new.rps * seconds) * 1e6
        if new.errors:
            print(f"  {name}: at {rate} req/s, a new connection each: {new.errors}", flush=True)
    return peak, latency


async def main(seconds: int, rate: int) -> None:
    missing = [tool for tool in ("nginx", "wrk", "hey") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: apt-get install nginx wrk hey")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"wrk -t1 -c{CONNECTIONS} {seconds}s, hey -c{HEY_WORKERS} at {rate} req/s {seconds}s"
    )
    print("sandbox: raw asyncio + uvloop responder (2-byte body, keep-alive), a subprocess")
    results: dict[str, tuple[Result, Result]] = {}
    sandbox_port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp,
        process(
            [sys.executable, "-m", "bench.proxy", "--sandbox", str(sandbox_port)], sandbox_port
        ),
    ):
        direct = f"http://127.0.0.1:{sandbox_port}/"
        results["direct"] = await measure("direct", direct, seconds, rate)
        async with ingress_on(sandbox_port) as url:  # this process: the activator's CPU too
            results["ingress"] = await measure("ingress", url, seconds, rate, [os.getpid()])
        for name, mode in FLOORS.items():
            floor_port = free_port()
            floor = [sys.executable, "-m", "bench.floor", str(floor_port), str(sandbox_port)]
            with process([*floor, *mode], floor_port) as bare:
                floor_url = f"http://127.0.0.1:{floor_port}/"
                results[name] = await measure(name, floor_url, seconds, rate, [bare.pid])
        nginx_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_conf(NGINX_CONF, tmp, upstream=sandbox_port, port=nginx_port))
        nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
        with process(nginx, nginx_port) as master:
            results["nginx"] = await measure(
                "nginx",
                f"http://127.0.0.1:{nginx_port}/",
                seconds,
                rate,
                with_children(master.pid),
            )
    slow = await slow_backend(seconds, rate)

    row = "{:<11} {:>12} {:>9} {:>9}   {:>10} {:>9} {:>9}  {}"
    print()
    print(
        row.format(
            "path", "wrk req/s", "p50 ms", "p99 ms", "hey req/s", "p50 ms", "p99 ms", "errors"
        )
    )
    for name, (peak, latency) in results.items():
        errors = " ".join(e for e in (peak.errors, latency.errors) if e) or "-"
        print(
            row.format(
                name,
                f"{peak.rps:,.0f}",
                f"{peak.p50_ms:.2f}",
                f"{peak.p99_ms:.2f}",
                f"{latency.rps:,.0f}",
                f"{latency.p50_ms:.2f}",
                f"{latency.p99_ms:.2f}",
                errors,
            )
        )
    (ing, ing_lat), (base, base_lat), (ngx, ngx_lat) = (
        results["ingress"],
        results["direct"],
        results["nginx"],
    )

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "n/a"

    print()
    print(
        f"ingress/direct: throughput {ratio(ing.rps, base.rps)}, "
        f"p50 at {rate}/s {ratio(ing_lat.p50_ms, base_lat.p50_ms)}x, "
        f"p99 {ratio(ing_lat.p99_ms, base_lat.p99_ms)}x"
    )
    print(
        f"ingress/nginx:  throughput {ratio(ing.rps, ngx.rps)}, "
        f"p50 at {rate}/s {ratio(ing_lat.p50_ms, ngx_lat.p50_ms)}x, "
        f"p99 {ratio(ing_lat.p99_ms, ngx_lat.p99_ms)}x"
    )
    print(
        f"CPU per request at peak: ingress {ing.cpu_us:.1f} µs (user {ing.user_us:.1f}), "
        f"nginx {ngx.cpu_us:.1f} µs (user {ngx.user_us:.1f}) "
        f"({ratio(ing.cpu_us, ngx.cpu_us)}x); a new connection each request: "
        f"{ing.cpu_new_us:.1f} µs, nginx {ngx.cpu_new_us:.1f} µs "
        f"({ratio(ing.cpu_new_us, ngx.cpu_new_us)}x)"
    )
    print(
        f"CPU per request at {rate} req/s: ingress {ing_lat.cpu_us:.1f} µs, nginx "
        f"{ngx_lat.cpu_us:.1f} µs ({ratio(ing_lat.cpu_us, ngx_lat.cpu_us)}x); a new "
        f"connection each request: {ing_lat.cpu_new_us:.1f} µs, nginx "
        f"{ngx_lat.cpu_new_us:.1f} µs ({ratio(ing_lat.cpu_new_us, ngx_lat.cpu_new_us)}x)"
    )
    for name, what in (
        ("floor", "the same stack, none of the ingress's work"),
        ("floor+rules", "and the ingress's header rules"),
    ):
        bare, bare_lat = results[name]
        print(
            f"{name} ({what}): {bare.cpu_us:.1f} µs (user {bare.user_us:.1f}) at peak, "
            f"{bare.cpu_new_us:.1f} with a new connection each, {bare_lat.cpu_us:.1f} at "
            f"{rate} req/s, {bare_lat.cpu_new_us:.1f} with a new connection each"
        )
    print(
        f"ingress adds at {rate}/s: p50 {ing_lat.p50_ms - base_lat.p50_ms:+.2f} ms, "
        f"p99 {ing_lat.p99_ms - base_lat.p99_ms:+.2f} ms over direct"
    )
    print()
    for shape, results in slow.items():
        print(f"a {SLOW_DELAY * 1000:.0f} ms backend at {rate} req/s, {shape}:")
        for name, result in results.items():
            errors = result.errors or "-"
            cpu = ""
            if result.cpu_us:  # the bursts' through a proxy: its CPU, and the user time of it
                cpu = f"  CPU {result.cpu_us:5.1f} µs a request (user {result.user_us:.1f})"
            print(
                f"  {name:<11} {result.rps:>7,.0f} req/s  p50 {result.p50_ms:6.1f} ms  "
                f"p95 {result.p95_ms:6.1f} ms  p99 {result.p99_ms:6.1f} ms  errors {errors}{cpu}"
            )
        for name in ("nginx", *FLOORS, "ingress"):
            added = results[name].p95_ms - results["direct"].p95_ms
            print(f"  {name} adds {added:+.1f} ms at p95")


SLOW_DELAY = 0.1
SLOW_WORKERS = 200
"""Enough workers that a 100 ms answer each still makes the rate: 1000 req/s needs 100 in
flight."""


PACED_LUA = """
math.randomseed(os.time())
local mean = %(mean_ms)f
wrk.headers["Host"] = "%(host)s"
function delay() return math.floor(-math.log(1 - math.random()) * mean) end
function done(summary, latency, requests)
  io.write(string.format("p95_us %%d\\n", latency:percentile(95)))
end
"""
"""wrk with a random think time before each request (exponential, so arrivals spread out
rather than come in ticks); wrk's latency does not count the think time."""


async def slow_backend(seconds: int, rate: int) -> dict[str, dict[str, Result]]:
    """Direct, through nginx, the floor and the ingress, against a sandbox that answers after
    SLOW_DELAY, under two shapes of the same rate:

    - hey: its workers fire on the same tick, so each tick is a burst of 200 requests: what a
      proxy adds is mostly how long the last of a burst waits behind the others, which is its
      CPU per request times the burst;
    - paced: wrk on 200 connections, each waiting a random (exponential) think time before
      each request, sized so the total comes near `rate`: requests arrive spread out."""
    port = free_port()
    sandbox = [sys.executable, "-m", "bench.proxy", "--sandbox", str(port)]
    results: dict[str, dict[str, Result]] = {
        f"hey -c{SLOW_WORKERS} (bursts)": {},
        f"wrk -c{SLOW_WORKERS} paced": {},
    }
    bursts, paced = results.values()
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp,
        process([*sandbox, "--delay", str(SLOW_DELAY)], port),
    ):
        print(f"  slow backend: {seconds}s at {rate} req/s, direct, nginx, floor, ingress ...")
        think = max(0.0, SLOW_WORKERS / rate - SLOW_DELAY) * 1000
        script = Path(tmp) / "paced.lua"
        script.write_text(PACED_LUA % {"mean_ms": think, "host": HOST})
        nginx_port = free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_conf(NGINX_CONF, tmp, upstream=port, port=nginx_port))
        nginx = ["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"]
        floor_port = free_port()
        floor = [sys.executable, "-m", "bench.floor", str(floor_port), str(port)]
        paths = (
            ("direct", f"http://127.0.0.1:{port}/"),
            ("nginx", f"http://127.0.0.1:{nginx_port}/"),
            *((name, f"http://127.0.0.1:{floor_port}/") for name in FLOORS),
            ("ingress", None),
        )
        for name, url in paths:
            async with contextlib.AsyncExitStack() as stack:
                pids: list[int] = []  # the proxy's processes (direct: none)
                if name == "nginx":
                    master = stack.enter_context(process(nginx, nginx_port)).pid
                    pids = with_children(master)
                if name in FLOORS:
                    bare = process([*floor, *FLOORS[name]], floor_port)
                    pids = [stack.enter_context(bare).pid]
                if url is None:
                    url = await stack.enter_async_context(ingress_on(port))
                    pids = [os.getpid()]  # the ingress and its activator, in this process
                # Warm-up, not counted: hey opens its 200 connections at once, and the first
                # answers through any proxy wait for 200 new upstream connections too.
                await run_hey(url, 1, rate, SLOW_WORKERS)
                before = cpu_seconds(*pids), user_seconds(*pids)
                bursts[name] = burst = await run_hey(url, seconds, rate, SLOW_WORKERS)
                if pids and burst.rps:
                    served = burst.rps * seconds / 1e6
                    burst.cpu_us = (cpu_seconds(*pids) - before[0]) / served
                    burst.user_us = (user_seconds(*pids) - before[1]) / served
                paced[name] = await run_wrk(url, seconds, script=script, connections=SLOW_WORKERS)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=1000, help="hey's total request rate")
    parser.add_argument(
        "--split",
        action="store_true",
        help="measure a 50/50 traffic split against none instead (bench/split.py)",
    )
    parser.add_argument("--runs", type=int, default=3, help="with --split: runs per side")
    parser.add_argument("--sandbox", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sandbox:
        run_sandbox(args.sandbox, args.delay)
    elif args.split:
        from bench import split

        logging.basicConfig(level=logging.WARNING)
        anyio.run(split.main, args.seconds, args.runs, backend_options={"use_uvloop": True})
    else:
        logging.basicConfig(level=logging.WARNING)
        anyio.run(main, args.seconds, args.rate, backend_options={"use_uvloop": True})
