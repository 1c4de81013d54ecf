"""Benchmark HTTP/2 through the ingress against nginx on the same trivial backend, in one run:
what an HTTP/2 request costs next to an HTTP/1.1 one, whether HTTP/1.1 clients pay for HTTP/2
support, what the ingress adds to a gRPC call, and where its HTTP/2 time goes.

- The backend: `bench.proxy`'s raw uvloop HTTP/1.1 responder (2-byte body, keep-alive), a
  subprocess. Both proxies reach it over HTTP/1.1 with keep-alive, whatever their clients speak.
- The ingress: `ingress.Ingress` in this process on uvloop, each one with the real `Activator`
  in-process on a memory store of its own (as `bench/proxy.py`): app `bench` on the backend,
  app `greeter` (`protocol = "h2c"`) on the gRPC server. nginx: Debian's, our own process, one
  worker, access log off, upstream keep-alive; `listen PORT http2` (h2c with prior knowledge,
  1.22's syntax), a plain HTTP/1.1 listener, and a `grpc_pass` one.
- CPU: the proxy's user + system time over the requests the client counted: this process's
  (`time.process_time`: the ingress and its activator) or nginx's master and worker (/proc).
  Unless `--no-pin`, the proxy runs on the first CPU and everything else (h2load, wrk, the
  backend, the gRPC client and server, py-spy, perf) on the second: req/s is then one core's
  worth for a proxy that is the bottleneck, and `busy` says whether it was. Other processes on
  the machine are not ours to stop: `waited` is the proxy's time runnable but without a CPU
  (/proc/PID/task/*/schedstat), and each part says how much CPU the others took meanwhile.

The parts:
1. HTTP/2 (h2load, h2c prior knowledge, `-c 10 -m 10`) and HTTP/1.1 (`h2load --h1 -c 100`, the
   same 100 requests in flight): req/s and CPU µs per request, the ingress and nginx, runs
   alternated (ABBA).
2. HTTP/1.1 through three fresh ingresses side by side, `http2` on, off (no preface sniff) and
   off again (the A/A control: its spread against the first off is the noise), runs
   alternated over rounds (ABBA); with keep-alive (h2load), then with a new connection per
   request (wrk, `Connection: close`), where the sniff is paid on every request.
3. gRPC unary calls (`examples/grpc-greeter/server.py`, a subprocess) at a fixed rate, open
   loop (a paced grpc.aio client on one channel, a subprocess): p50/p90/p99 direct, through
   the ingress, and through nginx's `grpc_pass`, and each proxy's CPU per call.
4. The ingress's profile (py-spy; cProfile without it) under h2load's HTTP/2 and under the gRPC
   rate: self time by package, the calls into `h2` (inclusive), the top functions. Then, in
   runs of their own, what goes on the wire per request and per gRPC call (reads, writes and
   frames, counted in the ingress, client side and sandbox side), and each proxy's system
   calls per request (`perf stat`, where perf may count them).
   Both proxies' runs end with h2load's GOAWAY; the answers the ingress drops then are counted.

Only loopback. From the repository root (needs `apt-get install nginx nghttp2-client wrk`,
and `pip install py-spy` for the profile); about three minutes, `--quick` under two:

    python -m bench.http2 [--quick] [--seconds 3] [--runs 2] [--rounds 6] [--rate 500] [--no-pin]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.http2")

import argparse
import asyncio
import collections
import contextlib
import cProfile
import json
import logging
import os
import platform
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import anyio
from prometheus_client import CollectorRegistry

from bench.harness import NGINX_HEAD, nginx_conf, process
from bench.procfs import TICK, children, cpu_seconds, waited, with_children
from bench.procfs import stat as _stat
from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Sandbox, SandboxStatus
from wakeful.ingress import Ingress, IngressSettings
from wakeful.process import settle_heap
from wakeful.store import Store
from wakeful.store.testing import free_port
from wakeful.store.url import open_store

ROOT = Path(__file__).resolve().parents[1]
GREETER = ROOT / "examples" / "grpc-greeter"
HOST = "bench.localhost"
GRPC_HOST = "greeter.localhost"
H2_LOAD = ["-c", "10", "-m", "10"]
"""HTTP/2: 10 connections, 10 streams each: 100 requests in flight."""
H1_LOAD = ["--h1", "-c", "100", "-m", "1"]
"""HTTP/1.1: 100 connections, one request at a time each (no pipelining): 100 in flight."""
CLOSE_CONNECTIONS = 16
"""wrk's connections for a new connection per request."""

NGINX_CONF = (
    NGINX_HEAD
    + """http {{
{http}
    keepalive_requests 10000000;
    upstream backend {{
        server 127.0.0.1:{backend};
        keepalive 128;
        keepalive_requests 10000000;
    }}
    upstream greeter {{
        server 127.0.0.1:{greeter};
        keepalive 16;
        keepalive_requests 10000000;
    }}
    server {{
        listen 127.0.0.1:{h2} http2;
        listen 127.0.0.1:{h1};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc} http2;
        location / {{ grpc_pass grpc://greeter; }}
    }}
}}
"""
)
"""One worker like the single-process ingress; `keepalive_requests` raised so that neither side
closes a connection mid-run (1.22's default is 1000 requests, then GOAWAY, which h2load does
not recover from)."""


# -- processes and their CPU ---------------------------------------------------------------------


@dataclass
class Pins:
    """Which CPUs the proxy and the rest run on (None: not pinned)."""

    proxy: list[int] | None = None
    rest: list[int] | None = None

    def rest_cmd(self, args: list[str]) -> list[str]:
        return self._cmd(self.rest, args)

    def proxy_cmd(self, args: list[str]) -> list[str]:
        return self._cmd(self.proxy, args)

    @staticmethod
    def _cmd(cpus: list[int] | None, args: list[str]) -> list[str]:
        return ["taskset", "-c", ",".join(map(str, cpus)), *args] if cpus else args


@dataclass
class Proxy:
    """How a proxy's CPU is read: its used CPU seconds, and its seconds waiting for a CPU."""

    cpu: Callable[[], float]
    wait: Callable[[], float]

    @classmethod
    def of(cls, pid: int) -> Proxy:
        """A process and its children (nginx's master and worker, once it forked)."""
        pids = [pid] if pid == os.getpid() else with_children(pid)
        own = time.process_time if pid == os.getpid() else lambda: cpu_seconds(*pids)
        return cls(own, lambda: waited(*pids))


class Machine:
    """How much CPU processes not of this benchmark took (other work on a shared machine):
    all CPUs' busy time (/proc/stat) less this process's, its waited-for children's and its
    live descendants' (a tick in a softirq counts for the process it interrupted)."""

    def __init__(self) -> None:
        self._at = self._read()

    @staticmethod
    def _ours() -> float:
        ticks = 0
        stack, seen = [os.getpid()], set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = _stat(pid)
                ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
                stack += children(pid)
        return ticks / TICK

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = sum(fields[0:3]) + fields[5] + fields[6]  # user nice system, irq softirq
        return time.monotonic(), busy / TICK, fields[7] / TICK, Machine._ours()

    def others(self) -> str:
        """Since the last call: the CPUs other processes kept busy on average, and stolen."""
        now = self._read()
        wall, busy, steal, ours = (b - a for a, b in zip(self._at, now, strict=True))
        self._at = now
        others = max(0.0, busy - ours) / max(wall, 1e-9)
        stolen = f", {steal / wall:.2f} stolen by the hypervisor" if steal / wall >= 0.01 else ""
        cpus = os.cpu_count()
        return f"other processes on the machine kept {others:.2f} of {cpus} CPUs busy{stolen}"


# -- the ingress -------------------------------------------------------------------------------


async def seed(store: Store, backend: int, greeter: int) -> None:
    """App `bench` (HTTP/1.1) on the backend, app `greeter` (h2c) on the gRPC server; one
    running sandbox each, capacity enough that one cached lease carries the load."""
    for app, port, protocol in (("bench", backend, "http1"), ("greeter", greeter, "h2c")):
        spec = AppSpec(
            command=[app],
            concurrency=Concurrency(requests_per_instance=1000, max_instances=1),
            protocol=protocol,
        )
        await store.put(f"apps/{app}", App(name=app, active_version="v1"))
        pool = f"{app}-v1"
        await store.put(
            f"pools/{pool}",
            Pool(name=pool, app=app, version="v1", spec=spec, desired_instances=1),
        )
        await store.put(
            f"sandboxes/sb-{app}",
            Sandbox(
                id=f"sb-{app}",
                pool=pool,
                app=app,
                node="n1",
                status=SandboxStatus.RUNNING,
                ready=True,
                address=f"127.0.0.1:{port}",
            ),
        )


@contextlib.asynccontextmanager
async def ingress_alone(backend: int, greeter: int, http2: bool) -> AsyncIterator[int]:
    """An ingress on loopback with `http2` on or off, with an activator and a store of its own
    (ingresses sharing one would share its capacity); yields its port."""
    async with open_store("memory://") as store:
        await seed(store, backend, greeter)
        registry = CollectorRegistry()
        config = ActivatorSettings(store_url="memory://", token="bench")
        activator = Activator(store, config, registry)
        settings = IngressSettings(
            store_url="memory://", listen="127.0.0.1:0", admin_listen="127.0.0.1:0", http2=http2
        )
        ingress = Ingress(settings, InProcessLeases(activator), store, registry)
        async with activator.running(), ingress.running():
            settle_heap()
            yield ingress.address[1]


class DroppedAnswers(logging.Filter):
    """Counts, and keeps out of the output, the ingress's warning for an answer the wire
    refused to send (`CannotSend`: a stream whose end went already). None are expected; the
    count is printed if any came."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "could not be sent on HTTP/2" in record.getMessage():
            self.count += 1
            return False
        return True


# -- the load --------------------------------------------------------------------------------


@dataclass
class Run:
    requests: int = 0
    rps: float = 0.0
    cpu_us: float = 0.0
    """The proxy's CPU µs per request."""
    busy: float = 0.0
    """The proxy's CPU seconds per second of the run."""
    waited: float = 0.0
    """The proxy's seconds waiting for a CPU per second of the run (other processes)."""
    errors: str = ""


async def h2load(pins: Pins, port: int, load: list[str], seconds: float) -> Run:
    args = ["h2load", *load, "-D", str(max(1, round(seconds))), "-H", f":authority: {HOST}"]
    done = await anyio.run_process(pins.rest_cmd([*args, f"http://127.0.0.1:{port}/"]), check=False)
    out = done.stdout.decode()
    found = re.search(r"^finished in [\d.]+s, ([\d.]+) req/s", out, re.M)
    counts = re.search(
        r"^requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        out,
        re.M,
    )
    codes = re.search(r"^status codes: \d+ 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out, re.M)
    if found is None or counts is None or codes is None:
        sys.exit(f"h2load said nothing usable:\n{out}\n{done.stderr.decode()}")
    bad = zip(
        (*counts.groups()[1:], *codes.groups()),
        ("failed", "errored", "timeout", "3xx", "4xx", "5xx"),
        strict=True,
    )
    return Run(
        requests=int(counts.group(1)),
        rps=float(found.group(1)),
        errors=", ".join(f"{n} {what}" for n, what in bad if n != "0"),
    )


async def wrk_closing(pins: Pins, port: int, seconds: float) -> Run:
    """wrk with a new connection per request (`Connection: close`)."""
    args = ["wrk", "-t1", f"-c{CLOSE_CONNECTIONS}", f"-d{max(1, round(seconds))}s"]
    args += ["-H", f"Host: {HOST}", "-H", "Connection: close", f"http://127.0.0.1:{port}/"]
    done = await anyio.run_process(pins.rest_cmd(args), check=False)
    out = done.stdout.decode()
    found = re.search(r"(\d+) requests in ([\d.]+)s", out)
    if found is None:
        sys.exit(f"wrk said nothing usable:\n{out}\n{done.stderr.decode()}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    return Run(
        requests=int(found.group(1)),
        rps=int(found.group(1)) / float(found.group(2)),
        errors=errors.group(0) if errors else "",
    )


async def measured(run: Callable[[], Awaitable[Run]], proxy: Proxy) -> Run:
    """`run()` with the proxy's CPU read around it."""
    before, wait, start = proxy.cpu(), proxy.wait(), time.monotonic()
    result = await run()
    used, wall = proxy.cpu() - before, time.monotonic() - start
    result.cpu_us = used / max(result.requests, 1) * 1e6
    result.busy = used / wall
    result.waited = (proxy.wait() - wait) / wall
    return result


def mean_run(runs: list[Run]) -> Run:
    return Run(
        requests=sum(r.requests for r in runs),
        rps=statistics.mean(r.rps for r in runs),
        cpu_us=statistics.mean(r.cpu_us for r in runs),
        busy=statistics.mean(r.busy for r in runs),
        waited=statistics.mean(r.waited for r in runs),
        errors="; ".join(r.errors for r in runs if r.errors),
    )


# -- 1. HTTP/2 and HTTP/1.1 against nginx --------------------------------------------------------


async def throughput(
    pins: Pins,
    seconds: float,
    runs: int,
    ingress: int,
    ngx: dict[str, int],
    nginx: Proxy,
) -> dict[tuple[str, str], Run]:
    own = Proxy.of(os.getpid())
    cells: list[tuple[str, str, int, list[str], Proxy]] = [
        ("HTTP/2", "ingress", ingress, H2_LOAD, own),
        ("HTTP/2", "nginx", ngx["h2"], H2_LOAD, nginx),
        ("HTTP/1.1", "nginx", ngx["h1"], H1_LOAD, nginx),
        ("HTTP/1.1", "ingress", ingress, H1_LOAD, own),
    ]
    print(
        f"  {len(cells)} cells, warm-up 1s each, then {runs} runs of {seconds:g}s each in "
        "ABBA order ...",
        flush=True,
    )
    for _, _, port, load, _ in cells:
        await h2load(pins, port, load, 1)
    found: dict[tuple[str, str], list[Run]] = {(proto, name): [] for proto, name, *_ in cells}
    for i in range(runs):
        for proto, name, port, load, proxy in cells if i % 2 == 0 else cells[::-1]:

            def run(p: int = port, ld: list[str] = load) -> Awaitable[Run]:
                return h2load(pins, p, ld, seconds)

            found[proto, name].append(await measured(run, proxy))
    return {key: mean_run(value) for key, value in found.items()}


def print_throughput(results: dict[tuple[str, str], Run], runs: int, seconds: float) -> None:
    print(
        f"\n1. Throughput and the proxy's CPU per request (h2load; the mean of {runs} runs of "
        f"{seconds:g}s; busy: the proxy's CPU seconds a second; 1-core: the req/s its CPU per "
        "request allows on a core of its own; waited: its seconds a second runnable but waiting "
        "for a CPU)"
    )
    row = "  {:<9} {:<8} {:>9} {:>12} {:>6} {:>9} {:>7}  {}"
    print(
        row.format("protocol", "proxy", "req/s", "CPU µs/req", "busy", "1-core", "waited", "errors")
    )
    for proto in ("HTTP/2", "HTTP/1.1"):
        for name in ("ingress", "nginx"):
            r = results[proto, name]
            print(
                row.format(
                    proto,
                    name,
                    f"{r.rps:,.0f}",
                    f"{r.cpu_us:.1f}",
                    f"{r.busy:.0%}",
                    f"{1e6 / r.cpu_us:,.0f}" if r.cpu_us else "-",
                    f"{r.waited:.0%}",
                    r.errors or "-",
                )
            )
    print(f"  (HTTP/2: h2load {' '.join(H2_LOAD)}; HTTP/1.1: h2load {' '.join(H1_LOAD)})")
    for proto in ("HTTP/2", "HTTP/1.1"):
        ing, ngx = results[proto, "ingress"], results[proto, "nginx"]
        print(
            f"  {proto:<8} ingress/nginx: req/s {ing.rps / ngx.rps:.2f}x, "
            f"CPU per request {ing.cpu_us / ngx.cpu_us:.2f}x"
        )
    for name in ("ingress", "nginx"):
        h2, h1 = results["HTTP/2", name], results["HTTP/1.1", name]
        print(
            f"  {name:<8} CPU per request, HTTP/2 against HTTP/1.1: {h2.cpu_us:.1f} against "
            f"{h1.cpu_us:.1f} µs ({h2.cpu_us / h1.cpu_us - 1:+.0%})"
        )


# -- 2. HTTP/1.1 with HTTP/2 support on and off ---------------------------------------------------


async def on_off(
    what: str, load: Callable[[int], Awaitable[Run]], rounds: int, arms: dict[str, int]
) -> dict[str, list[Run]]:
    """Each arm once to warm it, then `rounds` rounds over the arms, every other one reversed."""
    print(f"  {what}: {rounds} rounds over {', '.join(arms)} ...", flush=True)
    for port in arms.values():
        await load(port)
    names = list(arms)
    found: dict[str, list[Run]] = {name: [] for name in names}
    own = Proxy.of(os.getpid())
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:

            def run(p: int = arms[name]) -> Awaitable[Run]:
                return load(p)

            found[name].append(await measured(run, own))
    return found


def print_on_off(what: str, found: dict[str, list[Run]]) -> None:
    names = list(found)
    on, off, control = names
    rounds = len(found[on])
    print(f"  {what}: CPU µs per request, each round in the order run")
    for i in range(rounds):
        order = names if i % 2 == 0 else names[::-1]
        print("    " + "  ".join(f"{name:>4} {found[name][i].cpu_us:6.2f}" for name in order))
    for name in names:
        runs = found[name]
        errors = "; ".join(r.errors for r in runs if r.errors)
        print(
            f"    {name:<4} median {statistics.median(r.cpu_us for r in runs):6.2f} µs/request, "
            f"{statistics.median(r.rps for r in runs):8,.0f} req/s"
            + (f"  errors: {errors}" if errors else "")
        )

    def paired(a: str, b: str) -> tuple[float, float, float]:
        ratios = [x.cpu_us / y.cpu_us - 1 for x, y in zip(found[a], found[b], strict=True)]
        return statistics.median(ratios), min(ratios), max(ratios)

    effect, low, high = paired(on, off)
    noise, nlow, nhigh = paired(control, off)
    print(
        f"    {on} against {off}:  {effect:+.1%} (the median of the rounds' ratios; the rounds "
        f"{low:+.1%} .. {high:+.1%})"
    )
    print(
        f"    {control} against {off}: {noise:+.1%} (A/A, the noise; the rounds "
        f"{nlow:+.1%} .. {nhigh:+.1%})"
    )
    within = abs(effect) <= 0.03
    print(
        f"    goal, within 3%: {'met' if within else 'missed'} ({effect:+.1%}; A/A "
        f"{noise:+.1%}, {nlow:+.1%} .. {nhigh:+.1%})"
    )


# -- 3. gRPC ---------------------------------------------------------------------------------


def greeter_stub(target: str) -> tuple[object, object, object]:
    """A grpc.aio channel to `target` with GRPC_HOST as the authority, its stub, a request."""
    import grpc

    sys.path.insert(0, str(GREETER))
    protos, services = grpc.protos_and_services("greeter.proto")
    channel = grpc.aio.insecure_channel(target, options=[("grpc.default_authority", GRPC_HOST)])
    return channel, services.GreeterStub(channel), protos.HelloRequest(name="bench")


async def pace(target: str, rate: int, seconds: float, warmup: float) -> dict[str, object]:
    """Unary calls started at `rate` a second whatever the answers do (open loop), each in a
    task of its own; latency from the call's start to its answer, after `warmup` seconds.
    `lag_p99`: how late the calls started against their schedule (the pacer keeping up)."""
    import grpc

    channel, stub, request = greeter_stub(target)
    loop = asyncio.get_running_loop()
    first = 50
    for _ in range(first):  # the connection, and each side's first-call costs
        await stub.SayHello(request, timeout=10)  # type: ignore[attr-defined]
    latencies: list[float] = []
    lags: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    skip = int(rate * warmup)

    async def call(i: int, due: float) -> None:
        started = time.perf_counter()
        try:
            await stub.SayHello(request, timeout=10)  # type: ignore[attr-defined]
        except grpc.aio.AioRpcError as exc:
            errors[exc.code().name] += 1
            return
        if i >= skip:
            latencies.append(time.perf_counter() - started)
            lags.append(started - due)

    tasks = []
    start = time.perf_counter() + 0.05
    total = int(rate * (warmup + seconds))
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(call(i, due)))
    await asyncio.gather(*tasks)
    await channel.close()  # type: ignore[attr-defined]
    latencies.sort()
    lags.sort()

    def pct(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(len(values) * p))] * 1e3 if values else 0.0

    return {
        "total": first + total,
        "calls": len(latencies),
        "p50": pct(latencies, 0.50),
        "p90": pct(latencies, 0.90),
        "p99": pct(latencies, 0.99),
        "max": latencies[-1] * 1e3 if latencies else 0.0,
        "lag_p99": pct(lags, 0.99),
        "errors": dict(errors),
    }


@dataclass
class Calls:
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    lag_p99: float = 0.0
    calls: int = 0
    total: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    cpu_us: float | None = None
    """The proxy's CPU µs per call (all calls the client made, the warm-up's too)."""
    waited: float | None = None
    """The proxy's seconds waiting for a CPU a second (the client's whole run)."""
    failed: str = ""


async def grpc_latency(
    pins: Pins, port: int, rate: int, seconds: float, proxy: Proxy | None
) -> Calls:
    args = [sys.executable, "-m", "bench.http2", "--grpc-client", f"127.0.0.1:{port}"]
    args += ["--rate", str(rate), "--seconds", f"{seconds:g}"]
    before = (proxy.cpu(), proxy.wait()) if proxy is not None else (0.0, 0.0)
    start = time.monotonic()
    done = await anyio.run_process(pins.rest_cmd(args), check=False)
    wall = time.monotonic() - start
    if done.returncode != 0:
        return Calls(failed=(done.stderr.decode().strip().splitlines() or ["?"])[-1])
    calls = Calls(**json.loads(done.stdout.decode().strip().splitlines()[-1]))
    if proxy is not None:
        calls.cpu_us = (proxy.cpu() - before[0]) / max(calls.total, 1) * 1e6
        calls.waited = (proxy.wait() - before[1]) / wall
    return calls


def print_grpc(results: dict[str, Calls], rate: int, seconds: float) -> None:
    print(
        f"\n3. gRPC unary SayHello at {rate} calls/s, open loop (grpc.aio, one channel), "
        f"{seconds:g}s after 1s of warm-up"
    )
    row = "  {:<16} {:>6} {:>7} {:>7} {:>7} {:>7} {:>11} {:>13} {:>7}  {}"
    head = ("calls", "p50 ms", "p90 ms", "p99 ms", "max ms", "pacer lag99", "proxy µs/call")
    print(row.format("path", *head, "waited", "errors"))
    for name, r in results.items():
        if r.failed:
            print(f"  {name:<16} failed: {r.failed}")
            continue
        print(
            row.format(
                name,
                r.calls,
                f"{r.p50:.3f}",
                f"{r.p90:.3f}",
                f"{r.p99:.3f}",
                f"{r.max:.1f}",
                f"{r.lag_p99:.3f}",
                f"{r.cpu_us:.0f}" if r.cpu_us is not None else "-",
                f"{r.waited:.0%}" if r.waited is not None else "-",
                " ".join(f"{k}x{v}" for k, v in r.errors.items()) or "-",
            )
        )
    print(
        "  (latency from each call's start; pacer lag99: how late the calls started against the "
        "schedule; proxy µs/call: its CPU over all the client's calls; waited: the proxy's "
        "seconds a second runnable but waiting for a CPU)"
    )
    direct = results["direct"]
    if direct.failed:
        return
    for name, r in results.items():
        if name == "direct" or r.failed:
            continue
        goal = ""
        if name == "ingress":
            goal = f" (goal, at most 1 ms at p50: {'met' if r.p50 - direct.p50 <= 1 else 'missed'})"
        print(
            f"  {name} adds p50 {r.p50 - direct.p50:+.3f} ms, p99 {r.p99 - direct.p99:+.3f} ms"
            f"{goal}"
        )


# -- 4. the profile and the wire ----------------------------------------------------------------

PACKAGES = (
    ("/h2/", "h2"),
    ("/hpack/", "hpack"),
    ("/hyperframe/", "hyperframe"),
    ("/ingress/http2/", "ingress.http2"),
    ("/ingress/upstream/", "ingress.upstream"),
    ("/ingress/http1/", "ingress.http1"),
    ("/ingress/", "ingress (rest)"),
    ("/activator/", "activator"),
    ("/wakeful/", "wakeful (rest)"),
    ("/asyncio/", "asyncio (+uvloop)"),
    ("/logging/", "logging"),
    ("/enum.py", "enum"),
)
LIBRARY = ("h2", "hpack", "hyperframe")

Frame = tuple[str, str, int]
"""(function, file, line) of a sample's frame."""


def package(filename: str) -> str:
    for part, name in PACKAGES:
        if part in filename:
            return name
    return "other"


@dataclass
class Profile:
    tool: str
    samples: int
    self_time: dict[Frame, float]
    """Each function's share of the busy samples, self time."""
    entries: dict[str, float] = field(default_factory=dict)
    """The h2 library's functions that ingress code called, inclusive: each one's share."""


def pyspy_binary() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


async def pyspy(pins: Pins, seconds: float, out: Path) -> Profile | None:
    """py-spy on this process for `seconds`, raw (folded) stacks by function; None when it
    cannot run."""
    spy = pyspy_binary()
    if spy is None:
        return None
    args = [spy, "record", "--pid", str(os.getpid()), "--duration", f"{seconds:g}"]
    args += ["--rate", "250", "--format", "raw", "--function", "--full-filenames"]
    args += ["--output", str(out)]
    proc = await anyio.open_process(
        pins.rest_cmd(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return folded(out) if await proc.wait() == 0 else None


def _frame(text: str) -> Frame:
    found = re.match(r"(.*) \((.*):(\d+)\)$", text)
    return (found.group(1), found.group(2), int(found.group(3))) if found else (text, "", 0)


def folded(out: Path) -> Profile | None:
    """py-spy's raw output (`root;...;leaf count`, a frame `function (file:line)`)."""
    if not out.exists():
        return None
    own: collections.Counter[Frame] = collections.Counter()
    entries: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [_frame(text) for text in stack.split(";")]
        own[frames[-1]] += int(n)
        for i, frame in enumerate(frames):  # the first frame in the library: our call into it
            if package(frame[1]) in LIBRARY and i > 0:
                entries[f"{frames[i - 1][0]} -> {frame[0]}"] += int(n)
                break
    total = sum(own.values())
    if not total:
        return None
    return Profile(
        "py-spy, 250 Hz, the busy samples of every thread",
        total,
        {key: n / total for key, n in own.items()},
        {key: n / total for key, n in entries.items()},
    )


def cprofile(profiler: cProfile.Profile) -> Profile:
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())  # tottime
    return Profile(
        "cProfile, the loop's thread (its own cost inflates small functions)",
        sum(entry[1] for entry in raw.values()),
        {(fn, file, line): entry[2] / total for (file, line, fn), entry in raw.items()},
    )


async def profile(pins: Pins, seconds: float, load: Callable[[], Awaitable[object]]) -> Profile:
    """This process's profile while `load()` runs (it must outlast `seconds` by a second)."""
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp:
        found: list[Profile | None] = []
        async with anyio.create_task_group() as tasks:

            async def spy() -> None:
                found.append(await pyspy(pins, seconds, Path(tmp) / "profile.txt"))

            tasks.start_soon(spy)
            await anyio.sleep(0.3)  # py-spy attached
            await load()
        if found and found[0] is not None:
            return found[0]
    print("  (py-spy could not run: cProfile instead)")
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        await load()
    finally:
        profiler.disable()
    return cprofile(profiler)


def short(file: str) -> str:
    for marker in ("/site-packages/", "/lib/python3.11/", f"{ROOT}/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def print_profile(title: str, result: Profile, top: int) -> None:
    print(f"{title} ({result.tool}; {result.samples:,} samples)")
    by_package: dict[str, float] = collections.defaultdict(float)
    for (_, file, _), share in result.self_time.items():
        by_package[package(file)] += share
    print("  self time by package:")
    for name, share in sorted(by_package.items(), key=lambda item: -item[1]):
        if share >= 0.005:
            print(f"    {share:6.1%}  {name}")
    library = sum(by_package[p] for p in LIBRARY)
    print(f"    {library:6.1%}  = the h2 library (h2, hpack, hyperframe) in all")
    if result.entries:
        print("  the h2 library's time by the call into it (inclusive):")
        for name, share in sorted(result.entries.items(), key=lambda item: -item[1])[:8]:
            if share >= 0.005:
                print(f"    {share:6.1%}  {name}")
    print(f"  top {top} functions by self time (a C call's time is its Python caller's):")
    ranked = sorted(result.self_time.items(), key=lambda item: -item[1])[:top]
    for (function, file, line), share in ranked:
        print(f"    {share:6.1%}  {package(file):<17} {function} ({short(file)}:{line})")


FRAME_TYPES = (
    "DATA",
    "HEADERS",
    "PRIORITY",
    "RST_STREAM",
    "SETTINGS",
    "PUSH_PROMISE",
    "PING",
    "GOAWAY",
    "WINDOW_UPDATE",
    "CONTINUATION",
)


class Frames:
    """Counts frames by type, and empty DATA frames, in bytes that may split them anywhere."""

    def __init__(self, counts: collections.Counter[str], skip: int = 0) -> None:
        self.counts = counts
        self.skip = skip
        self.head = b""

    def feed(self, data: bytes) -> None:
        at = 0
        while at < len(data):
            if self.skip:
                step = min(self.skip, len(data) - at)
                self.skip -= step
                at += step
                continue
            piece = data[at : at + 9 - len(self.head)]
            at += len(piece)
            self.head += piece
            if len(self.head) < 9:
                return
            kind, length = self.head[3], int.from_bytes(self.head[:3], "big")
            name = FRAME_TYPES[kind] if kind < len(FRAME_TYPES) else f"type {kind}"
            self.counts[name if (kind or length) else "DATA (empty)"] += 1
            self.skip = length
            self.head = b""


@dataclass
class Wire:
    reads: int = 0
    writes: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: collections.Counter[str] = field(default_factory=collections.Counter)
    frames_out: collections.Counter[str] = field(default_factory=collections.Counter)


class _CountingTransport:
    def __init__(self, transport: asyncio.Transport, wire: Wire, preface: int) -> None:
        self._transport = transport
        self._wire = wire
        self._frames = Frames(wire.frames_out, skip=preface)

    def write(self, data: bytes) -> None:
        self._wire.writes += 1
        self._wire.bytes_out += len(data)
        self._frames.feed(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


@contextlib.contextmanager
def counting_wire() -> Iterator[dict[str, Wire]]:
    """While the block runs, each new HTTP/2 connection of the ingress, to a client ("client")
    or to a sandbox ("sandbox", h2c), counts its reads and writes and the frames in them (the
    classes patched: for a counting run, not a timed one)."""
    from wakeful.ingress.http1.connection import ClientConnection
    from wakeful.ingress.http2.connection import H2Connection
    from wakeful.ingress.upstream.h2c import H2Upstream

    wires = {"client": Wire(), "sandbox": Wire()}
    saved: list[tuple[type, str, object]] = []
    frames_in: dict[int, Frames] = {}

    def patch(cls: type, wire: Wire, client_side: bool) -> None:
        """`client_side`: the connection's peer is a client, whose first bytes are the
        preface; else the ingress is the client, and its own first bytes are."""
        made, received = cls.connection_made, cls.data_received  # type: ignore[attr-defined]
        preface_in, preface_out = (24, 0) if client_side else (0, 24)

        def connection_made(self: asyncio.Protocol, transport: asyncio.BaseTransport) -> None:
            frames_in[id(self)] = Frames(wire.frames_in, skip=preface_in)
            if not isinstance(transport, _CountingTransport):
                transport = _CountingTransport(transport, wire, preface_out)  # type: ignore[arg-type]
            made(self, transport)

        def data_received(self: asyncio.Protocol, data: bytes) -> None:
            wire.reads += 1
            wire.bytes_in += len(data)
            if (frames := frames_in.get(id(self))) is None:  # handed over by compiled code,
                frames = frames_in[id(self)] = Frames(wire.frames_in, skip=0)  # preface read
            frames.feed(data)
            received(self, data)

        saved.extend([(cls, "connection_made", made), (cls, "data_received", received)])
        cls.connection_made = connection_made  # type: ignore[attr-defined]
        cls.data_received = data_received  # type: ignore[attr-defined]

    def counted(self: asyncio.Protocol, transport: asyncio.BaseTransport) -> None:
        """A plain client connection, counted from its accept: compiled, it hands itself
        over to HTTP/2 without the patched `connection_made` (the first read, with the
        preface, is not counted then)."""
        accepted(self, _CountingTransport(transport, wires["client"], 0))  # type: ignore[arg-type]

    accepted = ClientConnection.connection_made
    saved.append((ClientConnection, "connection_made", accepted))
    ClientConnection.connection_made = counted  # type: ignore[method-assign]
    patch(H2Connection, wires["client"], client_side=True)
    patch(H2Upstream, wires["sandbox"], client_side=False)
    try:
        yield wires
    finally:
        for cls, name, method in saved:
            setattr(cls, name, method)


SYSCALLS = ("read", "recvfrom", "write", "writev", "sendto", "epoll_wait", "epoll_pwait")


async def syscalls(
    pins: Pins, pids: list[int], port: int, load: list[str], seconds: float
) -> dict[str, float] | None:
    """System calls per request of processes `pids` (all their threads) during an h2load run:
    `perf stat` on the syscall tracepoints; None when perf cannot count them."""
    if shutil.which("perf") is None:
        return None
    args = ["perf", "stat", "--no-inherit", "-x", ",", "-p", ",".join(map(str, pids))]
    for event in ("raw_syscalls:sys_enter", *(f"syscalls:sys_enter_{s}" for s in SYSCALLS)):
        args += ["-e", event]
    with tempfile.NamedTemporaryFile(prefix="wakeful-bench-perf-") as out:
        proc = await anyio.open_process(
            pins.rest_cmd([*args, "-o", out.name]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await anyio.sleep(0.3)  # perf attached
        run = await h2load(pins, port, load, seconds)
        proc.send_signal(signal.SIGINT)
        await proc.wait()
        text = Path(out.name).read_text()  # noqa: ASYNC240 (a small file, after the run)
    counts: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].isdigit():
            name = parts[2].removeprefix("raw_syscalls:sys_enter")
            counts[name.removeprefix("syscalls:sys_enter_") or "all"] = int(parts[0]) / max(
                run.requests, 1
            )
    return counts or None


def print_wire(what: str, wires: dict[str, Wire], count: int) -> None:
    n = max(count, 1)
    print(f"  on the wire per {what}:")
    for side, wire in wires.items():
        if not wire.reads and not wire.writes:
            continue
        print(
            f"    {side:<7} side: {wire.reads / n:.2f} reads ({wire.bytes_in / n:.0f} B), "
            f"{wire.writes / n:.2f} writes ({wire.bytes_out / n:.0f} B)"
        )
        for way, counts in (("in ", wire.frames_in), ("out", wire.frames_out)):
            shown = ", ".join(f"{kind} {c / n:.2f}" for kind, c in counts.most_common())
            print(f"      frames {way}: {shown}")


def print_syscalls(calls: dict[str, dict[str, float] | None]) -> None:
    if not any(calls.values()):
        print("  (perf could not count system calls here)")
        return
    print("  system calls per request of the proxy's process(es), all threads (perf stat):")
    names = ("all", *SYSCALLS)
    print("    " + " " * 18 + "".join(f"{name:>12}" for name in names))
    for name, counts in calls.items():
        if counts is not None:
            print(f"    {name:<18}" + "".join(f"{counts.get(s, 0.0):>12.2f}" for s in names))


# -- the run ---------------------------------------------------------------------------------


def versions() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "")
    nginx = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
    h2load = subprocess.run(["h2load", "--version"], capture_output=True, text=True).stdout
    libs = ", ".join(
        f"{name} {metadata.version(name)}"
        for name in ("h2", "hpack", "uvloop", "httptools", "grpcio")
    )
    return (
        f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python "
        f"{platform.python_version()}\n{libs}; {nginx.removeprefix('nginx version: ')}; "
        f"{h2load.strip()}"
    )


async def main(args: argparse.Namespace, pins: Pins) -> None:
    tools = ("nginx", "h2load", "wrk", "taskset")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: apt-get install nginx nghttp2-client wrk")
    dropped = DroppedAnswers()
    logging.getLogger("wakeful.ingress.http2.connection").addFilter(dropped)
    print(versions())
    print(f"command: python -m bench.http2 {' '.join(sys.argv[1:])}".rstrip())
    if pins.proxy:
        print(
            f"the proxy on CPU {pins.proxy}, everything else (h2load, wrk, the backend, the gRPC "
            f"client and server, py-spy, perf) on CPU {pins.rest}"
        )
    else:
        print("nothing pinned")
    machine = Machine()
    print(f"the machine's load average before the run: {os.getloadavg()[0]:.2f} (1 min)")
    backend, greeter = free_port(), free_port()
    ngx = {"h2": free_port(), "h1": free_port(), "grpc": free_port()}
    backend_cmd = pins.rest_cmd([sys.executable, "-m", "bench.proxy", "--sandbox", str(backend)])
    greeter_cmd = pins.rest_cmd([sys.executable, str(GREETER / "server.py")])
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="wakeful-bench-"))
        stack.enter_context(process(backend_cmd, backend))
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(nginx_conf(NGINX_CONF, tmp, backend=backend, greeter=greeter, **ngx))
        nginx_cmd = pins.proxy_cmd(["nginx", "-p", tmp, "-c", str(conf), "-g", "daemon off;"])
        nginx = stack.enter_context(process(nginx_cmd, ngx["h1"]))
        ngx_proxy = Proxy.of(nginx.pid)
        nginx_pids = with_children(nginx.pid)
        ingress = await stack.enter_async_context(ingress_alone(backend, greeter, http2=True))
        machine.others()

        print("1. HTTP/2 and HTTP/1.1, the ingress and nginx", flush=True)
        results = await throughput(pins, args.seconds, args.runs, ingress, ngx, ngx_proxy)
        print_throughput(results, args.runs, args.seconds)
        print(f"  ({machine.others()})")

        print("\n2. HTTP/1.1, HTTP/2 support on and off", flush=True)
        async with contextlib.AsyncExitStack() as three:  # alike but for the setting
            arms = {
                name: await three.enter_async_context(ingress_alone(backend, greeter, http2=on))
                for name, on in (("on", True), ("off", False), ("off'", False))
            }
            keep = await on_off(
                f"keep-alive, h2load {' '.join(H1_LOAD)} {args.onoff_seconds:g}s",
                lambda port: h2load(pins, port, H1_LOAD, args.onoff_seconds),
                args.rounds,
                arms,
            )
            close = await on_off(
                f"a connection per request, wrk -c{CLOSE_CONNECTIONS} 'Connection: close' "
                f"{args.onoff_seconds:g}s",
                lambda port: wrk_closing(pins, port, args.onoff_seconds),
                args.close_rounds,
                arms,
            )
        print(
            "\n2. HTTP/1.1 through the ingress with HTTP/2 support on against off (three fresh "
            f"ingresses side by side, {args.onoff_seconds:g}s runs, rounds in ABBA order)"
        )
        print_on_off(f"keep-alive (h2load {' '.join(H1_LOAD)})", keep)
        print_on_off(f"a new connection per request (wrk -c{CLOSE_CONNECTIONS})", close)
        print(f"  ({machine.others()})")

        print(f"\n3. gRPC at {args.rate}/s, direct, through the ingress, through nginx", flush=True)
        grpc_results: dict[str, Calls] = {}
        with process(greeter_cmd, greeter, env={"PORT": str(greeter)}):
            paths = (
                ("direct", greeter, None),
                ("ingress", ingress, Proxy.of(os.getpid())),
                ("nginx grpc_pass", ngx["grpc"], ngx_proxy),
            )
            for name, port, proxy in paths:
                print(f"  {name} ...", flush=True)
                grpc_results[name] = await grpc_latency(
                    pins, port, args.rate, args.grpc_seconds, proxy
                )
            print("  gRPC on the wire, through a new ingress ...", flush=True)
            grpc_count: tuple[dict[str, Wire], int] | None = None
            async with ingress_alone(backend, greeter, http2=True) as fresh:
                with counting_wire() as wires:
                    counted_calls = await grpc_latency(pins, fresh, args.rate, 2, None)
                if not counted_calls.failed:
                    grpc_count = (wires, counted_calls.total)
            print("  the ingress profiled under gRPC ...", flush=True)
            seconds = args.profile_seconds
            grpc_profile = await profile(
                pins, seconds, lambda: grpc_latency(pins, ingress, args.rate, seconds + 1, None)
            )
        print_grpc(grpc_results, args.rate, args.grpc_seconds)
        print(f"  ({machine.others()})")

        print("\n4. the ingress under HTTP/2: profile, wire, system calls", flush=True)
        seconds = args.profile_seconds
        found = await profile(pins, seconds, lambda: h2load(pins, ingress, H2_LOAD, seconds + 1))
        print_profile(
            f"\n4. Where the ingress's HTTP/2 time goes, h2load {' '.join(H2_LOAD)} {seconds:g}s",
            found,
            args.top,
        )
        print_profile(
            f"\n4b. ... and under gRPC, {args.rate} unary calls/s {seconds:g}s",
            grpc_profile,
            args.top // 2,
        )
        count_seconds = 2.0
        with counting_wire() as wires:
            counted = await h2load(pins, ingress, H2_LOAD, count_seconds)
        print_wire(
            f"HTTP/2 request ({counted.requests:,}, h2load {' '.join(H2_LOAD)}), counted in the "
            "ingress",
            wires,
            counted.requests,
        )
        if grpc_count is not None:
            print_wire(
                f"gRPC call ({grpc_count[1]:,} at {args.rate}/s), counted in the ingress",
                grpc_count[0],
                grpc_count[1],
            )
        me = [os.getpid()]
        calls = {
            "ingress HTTP/2": await syscalls(pins, me, ingress, H2_LOAD, count_seconds),
            "ingress HTTP/1.1": await syscalls(pins, me, ingress, H1_LOAD, count_seconds),
            "nginx HTTP/2": await syscalls(pins, nginx_pids, ngx["h2"], H2_LOAD, count_seconds),
            "nginx HTTP/1.1": await syscalls(pins, nginx_pids, ngx["h1"], H1_LOAD, count_seconds),
        }
        print_syscalls(calls)
        print(f"  ({machine.others()})")
    if dropped.count:
        print(
            f"\n(the ingress dropped {dropped.count} answers in all, each logged as a warning, "
            "for streams still in flight when h2load sent GOAWAY at the end of a run: `h2` "
            "sends nothing after a GOAWAY received)"
        )
    print(f"(the whole run: {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer of them")
    parser.add_argument("--seconds", type=float, help="each throughput run (3; quick: 2)")
    parser.add_argument("--runs", type=int, help="throughput runs per cell (2; quick: 1)")
    parser.add_argument("--rounds", type=int, help="on/off rounds, keep-alive (6; quick: 2)")
    parser.add_argument("--rate", type=int, default=500, help="gRPC calls a second")
    parser.add_argument("--top", type=int, default=20, help="functions shown in the profile")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--grpc-client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.grpc_client:
        result = asyncio.run(pace(args.grpc_client, args.rate, args.seconds, 1.0))
        print(json.dumps(result))
        sys.exit(0)
    quick = args.quick
    args.seconds = args.seconds or (2.0 if quick else 3.0)
    args.runs = args.runs or (1 if quick else 2)
    args.rounds = args.rounds or (2 if quick else 6)
    args.close_rounds = 2 if quick else 4
    args.onoff_seconds = 2.0
    args.grpc_seconds = 4.0 if quick else 5.0
    args.profile_seconds = 3.0 if quick else 4.0
    logging.basicConfig(level=logging.WARNING)
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) > 1:
        pins = Pins(proxy=cpus[:1], rest=cpus[1:])
        os.sched_setaffinity(0, cpus[:1])  # this thread (the ingress's loop) and its threads
    else:
        pins = Pins()
    anyio.run(main, args, pins, backend_options={"use_uvloop": True})
