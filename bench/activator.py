"""Benchmark the activator: pure admission decisions, then lease round trips in-process and
over HTTP, each as throughput and per-op latency (p50, p99).

1. The pure core (`activator.decisions`): `admit` over 20 routable sandboxes with varied leased
   capacity, and `plan_scale_up`, in a tight loop (timed in batches of 1000 calls, so a
   latency is a batch's mean per call).
2. Acquire+release pairs through `InProcessLeases` against a real `Activator` on the memory
   store: app `hello`, pool `hello-v1` (desired 4, max_instances 4), 4 running, ready
   sandboxes. Nothing parks: past 5 leases a sandbox come overflow leases, and scale-up is
   capped at 4, so the pool is never rewritten (last_activity is flushed as usual).
3. The same pairs through `HttpLeases` against `create_app(...)` served by uvicorn in this
   process; and a baseline for the HTTP layer alone: `HttpLeases` against a trivial FastAPI
   app on the same paths (POST answers a constant grant, DELETE answers 204).
4. Between two processes, as `wakeful ingress` and `wakeful activator` run: the same
   activator and app served by uvicorn (uvloop, httptools) in a child process
   (`--serve PORT`), called from this one through `HttpLeases` and through `ChannelLeases`
   (the lease channel: one WebSocket, many calls in flight; what `wakeful ingress` uses).

Round trips run sequentially, then with 50 concurrent workers (latency then includes the wait
behind the others). Figures only: no assertions. From the repository root, as a module
(`python bench/activator.py` would put bench/ first on sys.path and shadow the package):

    python -m bench.activator [--seconds S]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.activator")

import argparse
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import anyio
import anyio.lowlevel
import httpx
import uvicorn
import uvloop
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from wakeful.activator import decisions
from wakeful.activator.api import create_app
from wakeful.activator.client import ChannelLeases, HttpLeases, InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.leases import ActivatorError, LeaseGrant
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, Role, Sandbox, SandboxStatus
from wakeful.process import settle_heap
from wakeful.store.tokenbook import TokenBook
from wakeful.store.url import open_store

TOKEN = "bench-token"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = 50
BATCH = 1000
ROW = "{:<24} {:<13} {:>11} {:>10} {:>10}"
CANDIDATES = [
    decisions.Candidate(f"sb-{n:02d}", f"http://127.0.0.1:{9100 + n}", (n * 7) % 13)
    for n in range(20)
]
GRANT: dict[str, object] = {"lease_id": "0" * 32, "sandbox_id": "sb-00", "size": 2}
GRANT |= {"url": "http://127.0.0.1:9100", "overflow": False, "ttl_seconds": 60.0}


class Pairs(Protocol):
    async def acquire(self, app: str) -> LeaseGrant: ...

    async def release(self, lease_id: str) -> None: ...


def baseline_app() -> FastAPI:
    api = FastAPI()

    @api.post("/v1/leases")
    async def acquire() -> Response:
        return JSONResponse(GRANT)

    @api.delete("/v1/leases/{lease_id}", status_code=204)
    async def release(lease_id: str) -> Response:
        return Response(status_code=204)

    return api


def row(path: str, mode: str, rate: float, latencies: list[float]) -> None:
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    p50, p99 = f"{cuts[49] * 1000:.4f}", f"{cuts[98] * 1000:.4f}"
    print(ROW.format(path, mode, f"{rate:,.0f}", p50, p99), flush=True)


def tight_loop(call: Callable[[], object], seconds: float) -> tuple[float, list[float]]:
    """Call `call` in batches until `seconds` pass: (calls/s, per-call mean of each batch)."""
    latencies: list[float] = []
    began = time.perf_counter()
    end = began + seconds
    while (batch_began := time.perf_counter()) < end:
        for _ in range(BATCH):
            call()
        latencies.append((time.perf_counter() - batch_began) / BATCH)
    return len(latencies) * BATCH / (time.perf_counter() - began), latencies


def measure_decisions(seconds: float) -> None:
    def admit() -> object:
        return decisions.admit(CANDIDATES, "auto", 10)

    def plan() -> object:
        return decisions.plan_scale_up(
            leased=150,
            waiters=3,
            lease_size=2,
            requests_per_instance=10,
            desired=16,
            max_instances=20,
            live=16,
            now=1000.0,
            last_reread=990.0,
        )

    for name, call in (("decisions.admit", admit), ("decisions.plan_scale_up", plan)):
        row(name, "tight loop", *tight_loop(call, seconds))


async def pairs(leases: Pairs, seconds: float, workers: int) -> tuple[float, list[float], str]:
    """Acquire+release pairs from `workers` workers for `seconds`: (pairs/s, latencies, note).

    Each lease is held across one scheduling point, as a proxied request would hold it, so
    concurrent workers hold leases at the same time (and overflow past 5 a sandbox).
    """
    latencies: list[float] = []
    overflow = held = peak = 0
    end = time.perf_counter() + seconds

    async def work() -> None:
        nonlocal overflow, held, peak
        while time.perf_counter() < end:
            began = time.perf_counter()
            grant = await leases.acquire("hello")
            held += 1
            peak = max(peak, held)
            overflow += grant.overflow
            await anyio.lowlevel.checkpoint()
            await leases.release(grant.lease_id)
            held -= 1
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for _ in range(workers):
            tasks.start_soon(work)
    rate = len(latencies) / (time.perf_counter() - began)
    return rate, latencies, f"{overflow / len(latencies):.0%} overflow leases, peak {peak} held"


async def round_trips(path: str, leases: Pairs, seconds: float) -> list[str]:
    """Both modes, one table row each; a failure is printed as the row and ends the path."""
    notes: list[str] = []
    for mode, workers in (("sequential", 1), (f"{WORKERS} in flight", WORKERS)):
        failure: Exception | None = None
        try:
            await pairs(leases, min(0.5, seconds / 5), workers)  # warm up (connections too)
            rate, latencies, note = await pairs(leases, seconds, workers)
        except* (ActivatorError, httpx.HTTPError) as failed:
            failure = failed.exceptions[0]
        if failure is not None:
            print(f"{path:<24} {mode:<13} FAILED: {type(failure).__name__}: {failure}")
            return [*notes, f"{path}: failed, see the table"]
        row(path, mode, rate, latencies)
        notes.append(f"{path}, {mode}: {note}")
    return notes


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a free loopback port in this process; yield its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers no event)
                await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


@contextlib.asynccontextmanager
async def hello_activator(registry: CollectorRegistry) -> AsyncIterator[Activator]:
    async with open_store("memory://") as store:
        spec = AppSpec(command=["x"], concurrency=Concurrency(max_instances=4))
        await store.put("apps/hello", App(name="hello", active_version="v1"))
        pool = Pool(name="hello-v1", app="hello", version="v1", spec=spec, desired_instances=4)
        await store.put("pools/hello-v1", pool)
        for n in range(4):
            sandbox = Sandbox(
                id=f"hello-v1-{n}",
                pool="hello-v1",
                app="hello",
                status=SandboxStatus.RUNNING,
                ready=True,
                address=f"127.0.0.1:{9100 + n}",
            )
            await store.put(f"sandboxes/{sandbox.id}", sandbox)
        settings = ActivatorSettings(token=TOKEN, store_url="memory://")
        activator = Activator(store, settings, registry)
        async with activator.running():
            yield activator


async def run(seconds: float) -> None:
    registry = CollectorRegistry()
    async with hello_activator(registry) as activator:
        notes = await round_trips("InProcessLeases", InProcessLeases(activator), seconds)
        servers = [
            # The token an ingress has: the role check is part of what is measured.
            ("HttpLeases", create_app(activator, TokenBook.of({TOKEN: Role.INGRESS}), registry)),
            ("HTTP baseline (no-op)", baseline_app()),
        ]
        for path, app in servers:
            async with serving(app) as url:
                http = HttpLeases(url, TOKEN)
                try:
                    notes += await round_trips(path, http, seconds)
                finally:
                    await http.aclose()
        print("\n" + "\n".join(notes))
        for s in activator.snapshot():
            print(
                f"afterwards {s.pool}: desired {s.desired_instances}, live {s.live}, "
                f"ready {s.ready}, leased {s.leased}, overflow {s.overflow}, "
                f"waiters {s.waiters}, pool revision {s.revision}"
            )
        for metric in registry.collect():
            for sample in metric.samples:
                if sample.name == "wakeful_activator_scale_ups_total":
                    print(f"scale-up attempts, {sample.labels['result']}: {sample.value:.0f}")


async def serve_apart(port: int) -> None:
    """The child process of part 4: the activator and its API on `port` until killed."""
    registry = CollectorRegistry()
    async with hello_activator(registry) as activator:
        app = create_app(activator, TokenBook.of({TOKEN: Role.INGRESS}), registry)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        settle_heap()  # as `wakeful activator` does once it is up
        await uvicorn.Server(config).serve()


async def apart(seconds: float) -> list[str]:
    """Part 4: HttpLeases and ChannelLeases against an activator in another process."""
    settle_heap()  # as `wakeful ingress` does once it is up
    port = free_port()
    child = subprocess.Popen(  # noqa: ASYNC220 -- once, before anything is measured
        [sys.executable, "-m", "bench.activator", "--serve", str(port)], cwd=ROOT
    )
    notes: list[str] = []
    try:
        url = f"http://127.0.0.1:{port}"
        with anyio.fail_after(30):
            while True:
                try:
                    await anyio.connect_tcp("127.0.0.1", port)
                    break
                except OSError:
                    await anyio.sleep(0.05)
        for path, leases in (
            ("HttpLeases, 2 processes", HttpLeases(url, TOKEN)),
            ("ChannelLeases, 2 procs", ChannelLeases(url, TOKEN)),
        ):
            try:
                notes += await round_trips(path, leases, seconds)
            finally:
                await leases.aclose()
    finally:
        child.terminate()
        child.wait(10)
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement (3)")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        uvloop.run(serve_apart(args.serve))
        return
    if args.seconds < 0.1:
        parser.error("--seconds must be at least 0.1")
    print(f"Python {platform.python_version()} ({platform.python_implementation()})")
    print(f"cores: {os.cpu_count()} ({platform.system()} {platform.machine()})")
    print(f"{args.seconds:g} s per measurement; an op is one call, or one acquire+release pair\n")
    print(ROW.format("path", "mode", "ops/s", "p50 ms", "p99 ms"))
    print(ROW.format("-" * 24, "-" * 13, "-" * 11, "-" * 10, "-" * 10))
    measure_decisions(args.seconds)
    anyio.run(run, args.seconds, backend="asyncio")
    notes = anyio.run(apart, args.seconds, backend="asyncio", backend_options={"use_uvloop": True})
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
