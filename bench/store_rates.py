"""Benchmark the key-value store: operations per second and latency, per backend.

For each backend (memory, SQLite in a temporary directory, a real etcd started by
`store.testing.EtcdServer`) it measures three operations on a ~100-byte pydantic value:

- put: overwrite the worker's key;
- get: read the worker's key and decode it;
- cas: `update` the worker's key with the revision the previous write returned (a per-key
  chain, so every compare-and-set succeeds).

Each runs sequentially (one op at a time) and with 50 in flight (50 concurrent workers in an
anyio task group, each on its own key). Throughput is ops / wall time; latency is per op,
so with 50 in flight it includes the wait behind the other 49. The memory backend never
awaits inside an op, so its 50 workers in fact run one after another. Figures only: no
assertions.

    python bench/store_rates.py [--ops N] [--backends memory,sqlite,etcd]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
from pydantic import BaseModel

from wakeful.store import Store
from wakeful.store.testing import EtcdServer
from wakeful.store.url import open_store, sqlite_url

BACKENDS = ("memory", "sqlite", "etcd")
DEFAULT_OPS = {"memory": 2000, "sqlite": 2000, "etcd": 1000}
IN_FLIGHT = 50

Step = Callable[[], Awaitable[object]]
Prepare = Callable[[Store, str], Awaitable[Step]]


class Pool(BaseModel):
    """A small value: about 100 bytes of JSON."""

    name: str
    replicas: int
    ready: bool
    idle_seconds: float
    image: str


VALUE = Pool(
    name="pool-0042", replicas=3, ready=True, idle_seconds=12.5, image="registry/app:1.4.2"
)


async def prepare_put(store: Store, key: str) -> Step:
    return lambda: store.put(key, VALUE)


async def prepare_get(store: Store, key: str) -> Step:
    await store.put(key, VALUE)
    return lambda: store.get(key, Pool)


async def prepare_cas(store: Store, key: str) -> Step:
    revision = await store.put(key, VALUE)

    async def step() -> None:
        nonlocal revision
        revision = await store.update(key, VALUE, revision)

    return step


OPERATIONS: dict[str, Prepare] = {"put": prepare_put, "get": prepare_get, "cas": prepare_cas}


async def measure(
    store: Store, prepare: Prepare, prefix: str, ops: int, workers: int
) -> tuple[float, float, float]:
    """Run `ops` ops over `workers` concurrent workers: (ops/s, p50 ms, p99 ms)."""
    steps = [await prepare(store, f"{prefix}/w{n}") for n in range(workers)]
    for step in steps:  # warm up, untimed: one op per worker
        await step()
    latencies: list[float] = []

    async def work(step: Step, count: int) -> None:
        for _ in range(count):
            began = time.perf_counter()
            await step()
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for n, step in enumerate(steps):
            tasks.start_soon(work, step, ops // workers + (n < ops % workers))
    elapsed = time.perf_counter() - began
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return len(latencies) / elapsed, cuts[49] * 1000, cuts[98] * 1000


@contextlib.asynccontextmanager
async def backend_url(backend: str) -> AsyncIterator[str]:
    if backend == "memory":
        yield "memory://"
    elif backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="wakeful-bench-") as directory:
            yield sqlite_url(Path(directory, "store.db"))
    else:
        server = EtcdServer()
        try:
            await anyio.to_thread.run_sync(server.start)
            yield server.url
        finally:
            await anyio.to_thread.run_sync(server.close)


ROW = "{:<8} {:<10} {:<14} {:>10} {:>9} {:>9}"


async def run(backends: list[str], ops: int | None) -> None:
    print(ROW.format("backend", "operation", "mode", "ops/s", "p50 ms", "p99 ms"))
    print(ROW.format("-" * 8, "-" * 10, "-" * 14, "-" * 10, "-" * 9, "-" * 9))
    for backend in backends:
        count = ops or DEFAULT_OPS[backend]
        async with backend_url(backend) as url, open_store(url, namespace="/bench/") as store:
            for name, prepare in OPERATIONS.items():
                for mode, workers in (("sequential", 1), (f"{IN_FLIGHT} in flight", IN_FLIGHT)):
                    rate, p50, p99 = await measure(
                        store, prepare, f"{name}/{workers}", count, workers
                    )
                    print(
                        ROW.format(backend, name, mode, f"{rate:,.0f}", f"{p50:.3f}", f"{p99:.3f}"),
                        flush=True,
                    )


def etcd_version() -> str:
    binary = shutil.which("etcd")
    if binary is None:
        return "etcd: not on PATH"
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return (done.stdout.splitlines() or ["unknown"])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--ops",
        type=int,
        help="ops per measurement (default: "
        + ", ".join(f"{b} {n}" for b, n in DEFAULT_OPS.items())
        + ")",
    )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or not backends:
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    if args.ops is not None and args.ops < IN_FLIGHT:
        parser.error(f"--ops must be at least {IN_FLIGHT}")
    print(f"Python {platform.python_version()} ({platform.python_implementation()})")
    print(f"cores: {os.cpu_count()} ({platform.system()} {platform.machine()})")
    print(etcd_version())
    counts = {b: args.ops or DEFAULT_OPS[b] for b in backends}
    print("ops per measurement: " + ", ".join(f"{b} {n}" for b, n in counts.items()))
    print(f"value: {len(VALUE.model_dump_json())} bytes of JSON; latency is per op\n")
    anyio.run(run, backends, args.ops, backend="asyncio")


if __name__ == "__main__":
    main()
