"""Benchmark the log directory (issue 40): how many lines of sandbox output the control plane
takes a second and what each costs, in-process and over `POST /v1/logs`, and what the
ingress's access log costs per proxied request.

1. Ingestion in-process: `--nodes` shippers at once, each like a node's `LogShipper` (one
   batch in flight): batches of 256 KiB (`MAX_BATCH_BYTES`) split evenly over its 4 sandboxes,
   sandbox j of app `appj`, lines of 100 bytes, offsets running on from batch to batch. Each
   run gets a fresh `LogDir` (fdatasync on, 4 MiB segments gzipped on rotation, the default
   limits) in a temporary directory (under `--dir`; its file system is printed: on a tmpfs
   fdatasync costs nothing). This process's CPU (`time.process_time`: the loop, the writer
   thread and its gzip) over the lines; the window closes once the writer has done everything
   queued (an upkeep queued last). Beside it, run for run, alternated:
   - `LogDir.append` of the same lines already encoded: the writer alone, without the book;
   - `json.dumps` of the same records (what `LogBook` encodes per line): the encoding floor;
   - one file, `f.write` of a batch's encoded lines then `os.fdatasync`, batch after batch:
     the raw cost of putting the same bytes on disk.
   And how long `LogBook.record` holds the event loop for one batch (`ship` encodes on it).
2. Ingestion over HTTP: a real control plane (`wakeful activator --no-idle-monitor`, memory
   store, a subprocess) and `--nodes` httpx clients in this process, each posting its
   batches one after another with the admin token (a node token does the same, plus one store
   read per chunk: `logs_api.own_output`), each body `LogBatch.model_dump_json()` as
   `HttpLogSink` sends it. The control plane's CPU from /proc/PID/stat (utime + stime, all its
   threads) around each run. Alternated with posts of empty batches (what a quiet node sends
   every interval): the cost of a request itself.
3. The access log on the proxy's hot path (as `bench.split`): the ingress and the real
   activator in this process (memory store) over one trivial sandbox (`bench.proxy`'s
   responder), the activator's `access_sink` a `LogBook` on a real `LogDir`, as `wakeful up`
   wires it. The ingress is built with `IngressSettings(access_log=True)`; the "off" runs
   set its `access.every_app` to False, which is what `access_log=False` builds (the app does
   not ask for a log either). wrk -t1 -c32 per run, runs alternated (off, on, off, on, ...);
   this process's CPU over the requests wrk counted. Each run's window goes on after wrk until
   the traffic report after it has shipped its lines and the writer has written them (on both
   sides); the warm-up's lines are written before a window opens. Then `AccessLog.record`
   alone, per call, sampled out and kept: what the ingress itself adds per request.

Figures move between machines and with what else runs: read them against the baselines of the
same run. From the repository root (needs `apt-get install wrk`):

    python -m bench.logs [--seconds 3] [--rounds 3] [--access-seconds 5] [--runs 5]
    python -m bench.logs --only access [--access-rate 1000]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.logs")

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from prometheus_client import CollectorRegistry

from bench.harness import CONNECTIONS, process, seed
from bench.split import wrk
from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logdir import LogDir, encode
from wakeful.domain.logbatch import MAX_BATCH_BYTES, LogBatch, OutputChunk
from wakeful.domain.logfiles import iso
from wakeful.ingress import Ingress, IngressSettings
from wakeful.ingress.accesslog import AccessLog
from wakeful.process import settle_heap
from wakeful.store.testing import free_port
from wakeful.store.url import open_store

LINE_BYTES = 100
SANDBOXES = 4
"""Per node; sandbox j of each node runs app `appj`."""
TOKEN = "bench-logs-token"
LIMITS = ActivatorSettings(store_url="memory://", token="bench").log_limits()
"""The control plane's defaults (WAKEFUL_LOG_RETENTION, _MAX_BYTES, _APP_MAX_BYTES)."""


# -- the workload ----------------------------------------------------------------------------


def output_text(lines: int, seed: int) -> str:
    """`lines` lines of LINE_BYTES bytes each (ASCII, the newline included)."""
    made = []
    for n in range(lines):
        line = (
            f"2026-12-05T05:40:{n % 60:02d}.{n % 1000:03d}Z INFO handled GET "
            f"/api/items/{(seed * 7919 + n * 31) % 100000:05d} status=200 ms={n % 97}.{n % 10} "
            f"user=u{(seed + n) % 4096:04d} "
        )
        made.append(line.ljust(LINE_BYTES - 1, "x")[: LINE_BYTES - 1])
    return "\n".join(made) + "\n"


class Feed:
    """One node's output: SANDBOXES sandboxes, each batch the next `batch_bytes` of their
    lines split evenly (`LogShipper._plan` with every sandbox behind), offsets running on."""

    def __init__(self, node: str, batch_bytes: int = MAX_BATCH_BYTES) -> None:
        per = batch_bytes // SANDBOXES // LINE_BYTES
        self.node = node
        self.ids = [f"sb-{node}-{j}" for j in range(SANDBOXES)]
        self.apps = [f"app{j}" for j in range(SANDBOXES)]
        self.texts = [output_text(per, seed) for seed in range(SANDBOXES)] if per else []
        self.offsets = [0] * SANDBOXES
        self.lines = per * len(self.texts)

    def batch(self) -> LogBatch:
        chunks = []
        for j, text in enumerate(self.texts):
            chunks.append(
                OutputChunk.model_construct(
                    sandbox=self.ids[j],
                    app=self.apps[j],
                    version="v1",
                    created_at=1.0,
                    offset=self.offsets[j],
                    size=len(text),
                    text=text,
                    finished=False,
                )
            )
            self.offsets[j] += len(text)
        return LogBatch.model_construct(
            node=self.node, interval=1.0, pending=0, dropped=0, chunks=chunks
        )

    def records(self) -> list[list[dict[str, Any]]]:
        """Per sandbox, the records `LogBook` makes of one batch's lines."""
        at = time.time()
        found = []
        for j, text in enumerate(self.texts):
            base = {"app": self.apps[j], "version": "v1", "sandbox": self.ids[j], "node": self.node}
            mine = []
            for line in text.split("\n")[:-1]:
                at += 1e-6
                mine.append({"ts": round(at, 6), "time": iso(at), **base, "line": line})
            mine[-1]["o"] = len(text)
            found.append(mine)
        return found


@dataclass
class Run:
    lines: int
    requests: int
    seconds: float
    """Wall time."""
    cpu: float
    clients: float = 0.0
    """The CPU of the clients (this process), where they are apart."""

    @property
    def rate(self) -> float:
        return self.lines / self.seconds

    @property
    def per_line_us(self) -> float:
        return self.cpu / self.lines * 1e6 if self.lines else 0.0

    @property
    def per_request_us(self) -> float:
        return self.cpu / self.requests * 1e6 if self.requests else 0.0


def spread(values: list[float], form: str = "{:,.1f}") -> str:
    """The median, then the lowest and highest."""
    median = form.format(statistics.median(values))
    return f"{median} ({form.format(min(values))}..{form.format(max(values))})"


def filesystem(path: Path) -> str:
    """The file system `path` is on, from /proc/self/mounts: `ext4 /dev/vda on /`."""
    best = ("", "?", "?")
    resolved = str(path.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, mount, kind = line.split()[:3]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, kind, device)
    return f"{best[1]} {best[2]} on {best[0]}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


# -- 1. ingestion in this process ------------------------------------------------------------


def written_output(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("wakeful_logs_lines_written_total", {"kind": "output"}) or 0.0


Driver = Callable[[Feed, float], Awaitable[int]]
"""Ships a feed's batches until a deadline (`time.perf_counter`): the lines it shipped."""


async def with_logdir(
    root: Path, seconds: float, nodes: int, driver: Callable[[LogDir], Driver]
) -> Run:
    """`driver(logdir)` for each node's feed at once, on a fresh LogDir; the CPU window closes
    once the writer did everything queued (its compressions too)."""
    registry = CollectorRegistry()
    logdir = LogDir(root, "bench", LIMITS, registry=registry)
    await anyio.to_thread.run_sync(logdir.start)
    feeds = [Feed(f"n{i}") for i in range(nodes)]
    drive = driver(logdir)
    counts: list[int] = []

    async def node(feed: Feed) -> None:
        counts.append(await drive(feed, deadline))

    try:
        cpu, started = time.process_time(), time.perf_counter()
        deadline = started + seconds
        async with anyio.create_task_group() as tasks:
            for feed in feeds:
                tasks.start_soon(node, feed)
        await asyncio.wrap_future(logdir.upkeep())
        run = Run(sum(counts), 0, time.perf_counter() - started, time.process_time() - cpu)
    finally:
        await anyio.to_thread.run_sync(logdir.stop)
        shutil.rmtree(root, ignore_errors=True)
    if written_output(registry) != run.lines:
        sys.exit(f"the log directory wrote {written_output(registry):.0f} of {run.lines} lines")
    return run


async def logbook_ship(root: Path, seconds: float, nodes: int) -> Run:
    """The product's path: `LogBook.ship`, awaited as the node agent in `wakeful up` does."""

    def driver(logdir: LogDir) -> Driver:
        book = LogBook(logdir)

        async def drive(feed: Feed, deadline: float) -> int:
            lines = 0
            while time.perf_counter() < deadline:
                await book.ship(feed.batch())
                lines += feed.lines
            return lines

        return drive

    return await with_logdir(root, seconds, nodes, driver)


async def logdir_append(root: Path, seconds: float, nodes: int) -> Run:
    """The writer alone: the same lines, encoded beforehand, one append per app."""
    lines_of = {
        f"n{i}": [[encode(record) for record in mine] for mine in Feed(f"n{i}").records()]
        for i in range(nodes)
    }

    def driver(logdir: LogDir) -> Driver:
        async def drive(feed: Feed, deadline: float) -> int:
            encoded = lines_of[feed.node]
            lines = 0
            while time.perf_counter() < deadline:
                now = time.time()
                pending = [
                    asyncio.wrap_future(logdir.append(feed.apps[j], "output", mine, now, now))
                    for j, mine in enumerate(encoded)
                ]
                await asyncio.gather(*pending)
                lines += feed.lines
            return lines

        return drive

    return await with_logdir(root, seconds, nodes, driver)


def json_dumps(seconds: float) -> Run:
    """The encoding floor: `encode` (json.dumps) of the records of a batch, over and over."""
    records = [record for mine in Feed("n0").records() for record in mine]
    lines = 0
    cpu, started = time.process_time(), time.perf_counter()
    while time.perf_counter() < started + seconds:
        for record in records:
            encode(record)
        lines += len(records)
    return Run(lines, 0, time.perf_counter() - started, time.process_time() - cpu)


def raw_write(root: Path, seconds: float) -> Run:
    """The disk floor: a batch's encoded lines to one file, `fdatasync` after each batch."""
    encoded = [encode(record) for mine in Feed("n0").records() for record in mine]
    root.mkdir(parents=True, exist_ok=True)
    path = root / "raw.jsonl"
    lines = 0
    try:
        with open(path, "ab") as out:
            cpu, started = time.process_time(), time.perf_counter()
            while time.perf_counter() < started + seconds:
                out.write(b"".join(encoded))
                out.flush()
                os.fdatasync(out.fileno())
                lines += len(encoded)
            return Run(lines, lines, time.perf_counter() - started, time.process_time() - cpu)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def record_time(root: Path, batches: int = 20) -> list[float]:
    """Milliseconds `LogBook.record` takes on one 256 KiB batch: `ship` runs it on the event
    loop, in one piece, before it waits for the disk."""
    logdir = LogDir(root, "bench", LIMITS)
    await anyio.to_thread.run_sync(logdir.start)
    book, feed, took = LogBook(logdir), Feed("n0"), []
    try:
        for _ in range(batches):
            batch = feed.batch()
            started = time.perf_counter()
            pending = book.record(batch, time.time())
            took.append((time.perf_counter() - started) * 1000)
            await asyncio.gather(*(asyncio.wrap_future(f) for f in pending))
    finally:
        await anyio.to_thread.run_sync(logdir.stop)
        shutil.rmtree(root, ignore_errors=True)
    return took


async def in_loop(measure: Callable[..., Run], *args: Any) -> Run:
    """A baseline that blocks: run here, nothing else in this process has work meanwhile."""
    return measure(*args)


async def ingestion(tmp: Path, seconds: float, rounds: int, nodes: int) -> None:
    feed = Feed("n0")
    sample = [encode(record) for mine in feed.records() for record in mine]
    print(
        f"\n1. ingestion in this process: {nodes} nodes at once, each batch "
        f"{feed.lines * LINE_BYTES // 1024} KiB ({feed.lines} lines of {LINE_BYTES} bytes, "
        f"{SANDBOXES} sandboxes of {SANDBOXES} apps); a line on disk is "
        f"{sum(map(len, sample)) / len(sample):.0f} bytes before gzip. {seconds:g} s per run, "
        f"{rounds} rounds, the variants alternated",
        flush=True,
    )
    variants: dict[str, Callable[[Path], Awaitable[Run]]] = {
        "LogBook.ship (the product)": lambda root: logbook_ship(root, seconds, nodes),
        "LogDir.append, pre-encoded": lambda root: logdir_append(root, seconds, nodes),
        "baseline: json.dumps/line": lambda root: in_loop(json_dumps, seconds),
        "baseline: write+fdatasync": lambda root: in_loop(raw_write, root, seconds),
    }
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for number in range(rounds):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for name in order:
            run = await variants[name](tmp / f"ingest-{number}")
            runs[name].append(run)
            print(
                f"  {name:28} {run.rate:11,.0f} lines/s  {run.per_line_us:6.2f} us CPU/line  "
                f"{run.cpu / run.seconds:4.2f} CPUs busy",
                flush=True,
            )
    print("  medians (lowest..highest):")
    print(f"  {'':28} {'lines/s':>33}  {'us CPU/line':>20}  CPUs busy")
    for name, found in runs.items():
        print(
            f"  {name:28} {spread([r.rate for r in found], '{:,.0f}'):>33}  "
            f"{spread([r.per_line_us for r in found], '{:.2f}'):>20}  "
            f"{statistics.median(r.cpu / r.seconds for r in found):.2f}"
        )
    product = statistics.median(r.per_line_us for r in runs["LogBook.ship (the product)"])
    for name in list(variants)[1:]:
        other = statistics.median(r.per_line_us for r in runs[name])
        print(f"  LogBook.ship costs {product / other:5.1f}x {name.split(': ')[-1]}")
    took = await record_time(tmp / "record")
    print(
        f"  LogBook.record of one 256 KiB batch holds the event loop {spread(took, '{:.1f}')} ms "
        f"(wall, {len(took)} batches)"
    )


# -- 2. ingestion over HTTP ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def control_plane(tmp: Path) -> AsyncIterator[tuple[str, int]]:
    """`wakeful activator` (memory store, no idle monitor): its URL and pid."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("WAKEFUL_")}
    env |= {
        "WAKEFUL_STORE_URL": "memory://",
        "WAKEFUL_TOKEN": TOKEN,
        "WAKEFUL_LISTEN": f"127.0.0.1:{port}",
    }
    data = tmp / "plane"
    data.mkdir(mode=0o700)
    said = tmp / "activator.out"
    command = [sys.executable, "-m", "wakeful.cli", "--data-dir", str(data)]
    out = os.open(said, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = await anyio.open_process(
            [*command, "activator", "--no-idle-monitor"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    finally:
        os.close(out)
    try:
        deadline = time.monotonic() + 60
        while b"listening on" not in said.read_bytes():
            if proc.returncode is not None or time.monotonic() > deadline:
                sys.exit(f"the control plane did not start:\n{said.read_text()[-3000:]}")
            await anyio.sleep(0.1)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        with anyio.CancelScope(shield=True):
            proc.terminate()
            with anyio.move_on_after(30) as waited:
                await proc.wait()
            if waited.cancelled_caught:
                proc.kill()
                await proc.wait()
            await proc.aclose()


async def post_run(
    clients: list[httpx.AsyncClient], feeds: list[Feed], pid: int, seconds: float
) -> Run:
    """Each client posts its feed's batches one after another (a node waits for the answer)."""
    counts: list[tuple[int, int]] = []

    async def node(client: httpx.AsyncClient, feed: Feed) -> None:
        lines = requests = 0
        while time.perf_counter() < deadline:
            answer = await client.post(
                "/v1/logs",
                content=feed.batch().model_dump_json(),
                headers={"Content-Type": "application/json"},
            )
            if answer.status_code != 204:
                raise RuntimeError(f"POST /v1/logs answered {answer.status_code}: {answer.text}")
            lines += feed.lines
            requests += 1
        counts.append((lines, requests))

    own, cpu, started = time.process_time(), cpu_seconds(pid), time.perf_counter()
    deadline = started + seconds
    async with anyio.create_task_group() as tasks:
        for client, feed in zip(clients, feeds, strict=True):
            tasks.start_soon(node, client, feed)
    seconds = time.perf_counter() - started
    own = time.process_time() - own
    await anyio.sleep(0.3)  # the writer's compressions after its last answer
    lines, requests = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return Run(lines, requests, seconds, cpu_seconds(pid) - cpu, own)


async def over_http(tmp: Path, seconds: float, rounds: int, nodes: int) -> None:
    print(
        f"\n2. ingestion over POST /v1/logs: `wakeful activator` (memory store) and {nodes} "
        f"httpx clients (admin token), each one batch in flight; {seconds:g} s per run, "
        f"{rounds} rounds alternated with empty batches",
        flush=True,
    )
    async with contextlib.AsyncExitStack() as stack:
        url, pid = await stack.enter_async_context(control_plane(tmp))
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
                )
            )
            for _ in range(nodes)
        ]
        shapes = {
            "256 KiB batches": [Feed(f"n{i}") for i in range(nodes)],
            "empty batches": [Feed(f"n{i}", batch_bytes=0) for i in range(nodes)],
        }
        warm = await post_run(clients, shapes["256 KiB batches"], pid, 0.5)
        idle = cpu_seconds(pid)
        await anyio.sleep(2)
        idle = (cpu_seconds(pid) - idle) / 2
        print(f"  the control plane idle: {idle * 1000:.0f} ms CPU/s (inside each window too)")
        runs: dict[str, list[Run]] = {name: [] for name in shapes}
        for number in range(rounds):
            order = list(shapes) if number % 2 == 0 else list(reversed(shapes))
            for name in order:
                run = await post_run(clients, shapes[name], pid, seconds)
                runs[name].append(run)
                print(
                    f"  {name:16} {run.requests / run.seconds:6,.0f} batches/s "
                    f"{run.rate:9,.0f} lines/s  {run.per_request_us / 1000:6.2f} ms CPU/batch  "
                    f"{run.per_line_us:5.2f} us CPU/line  control plane "
                    f"{run.cpu / run.seconds:4.2f} CPUs, clients {run.clients / run.seconds:4.2f}",
                    flush=True,
                )
        metrics = (await clients[0].get("/metrics")).text
    print("  medians (lowest..highest):")
    for name, done in runs.items():
        per_line = ""
        if name != "empty batches":
            per_line = (
                f"{spread([r.rate for r in done], '{:,.0f}')} lines/s, "
                f"{spread([r.per_line_us for r in done], '{:.2f}')} us CPU/line, "
            )
        print(
            f"  {name:16} {per_line}"
            f"{spread([r.requests / r.seconds for r in done], '{:,.0f}')} batches/s, "
            f"{spread([r.per_request_us / 1000 for r in done], '{:.3f}')} ms CPU/batch"
        )
    floor = statistics.median(r.per_request_us for r in runs["empty batches"])
    full = runs["256 KiB batches"]
    batch = statistics.median(r.per_request_us for r in full)
    lines = full[0].lines / full[0].requests
    print(
        f"  of a 256 KiB batch's CPU, the request itself (an empty batch's) is "
        f"{floor / batch:.1%}; the rest is {(batch - floor) / lines:.2f} us a line"
    )
    found = re.search(r'^wakeful_logs_lines_written_total\{kind="output"\} (\S+)$', metrics, re.M)
    sent = warm.lines + sum(r.lines for r in full)
    written = float(found.group(1)) if found is not None else -1
    if written != sent:
        sys.exit(f"the control plane wrote {written:,.0f} lines, {sent:,} were acknowledged")
    print(f"  the control plane wrote every line acknowledged ({sent:,}, its metrics say)")


# -- 3. the access log on the hot path -------------------------------------------------------


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


OUTCOMES = ("kept", "sampled", "capped", "overflowed")


def access_counts(registry: CollectorRegistry) -> dict[str, float]:
    counts = {
        outcome: sample(registry, "wakeful_ingress_access_lines_total", outcome=outcome)
        for outcome in OUTCOMES
    }
    counts["written"] = sample(registry, "wakeful_logs_lines_written_total", kind="access")
    counts["dropped"] = sum(
        sample(registry, "wakeful_logs_lines_dropped_total", reason=reason)
        for reason in ("backlog", "disk")
    )
    return counts


async def shipped(registry: CollectorRegistry, interval: float) -> None:
    """Until the traffic report after now has gone and the writer wrote what it carried."""
    await anyio.sleep(interval + 0.1)
    deadline = time.monotonic() + 3 * interval
    while time.monotonic() < deadline:
        counts = access_counts(registry)
        if counts["written"] + counts["dropped"] + counts["overflowed"] >= counts["kept"]:
            return
        await anyio.sleep(0.05)


def record_cost(rate: int, calls: int = 300_000) -> tuple[float, float]:
    """`AccessLog.record` alone, microseconds a call: past the rate (most calls sampled out, as
    under wrk) and below it (every line kept: a clock that moves a second per rate/2 calls)."""
    request = ("bench", "v1", "sb-1", "GET", b"/", 200, 2, 0.0004, "", "0af3c2e1", False)
    ticks = itertools.count()
    costs = []
    for clock in (time.time, lambda: next(ticks) * 2 / rate):
        access = AccessLog(True, rate, CollectorRegistry(), clock=clock)
        cpu = time.process_time()
        for n in range(calls):
            access.record(*request)
            if n % 1000 == 0:
                access.take()  # as the traffic report loop does
        costs.append((time.process_time() - cpu) / calls * 1e6)
    return costs[0], costs[1]


async def access_cost(tmp: Path, seconds: int, runs: int, rate: int, control: bool = False) -> None:
    """`control`: both sides off (an A/A run), to see what the method itself makes of two
    equal sides."""
    print(
        f"\n3. the access log on the proxy's hot path: wrk -t1 -c{CONNECTIONS} {seconds}s per "
        f"run, {runs} runs per side, alternated; access_log_rate {rate}/s",
        flush=True,
    )
    port = free_port()
    registry = CollectorRegistry()
    costs: dict[str, list[float]] = {"off": [], "on": []}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    outcomes: dict[str, float] = dict.fromkeys(OUTCOMES, 0.0)
    written: list[float] = []
    total_written = 0.0
    with process([sys.executable, "-m", "bench.proxy", "--sandbox", str(port)], port):
        async with open_store("memory://") as store:
            await seed(store, port)
            config = ActivatorSettings(store_url="memory://", token="bench")
            activator = Activator(store, config, registry)
            logdir = LogDir(tmp / "access-logs", "bench", LIMITS, registry=registry)
            await anyio.to_thread.run_sync(logdir.start)
            activator.access_sink = LogBook(logdir).take_access  # as wakeful.bootstrap does
            settings = IngressSettings(
                store_url="memory://",
                listen="127.0.0.1:0",
                admin_listen="127.0.0.1:0",
                access_log=True,
                access_log_rate=rate,
            )
            ingress = Ingress(settings, InProcessLeases(activator), store, registry)
            interval = settings.traffic_report_interval
            try:
                async with activator.running(), ingress.running():
                    settle_heap()  # as `wakeful up` and `wakeful ingress` do once they are up
                    url = "http://{}:{}/".format(*ingress.address)
                    await wrk(url, 1)  # warm-up: connections, the lease
                    for index in range(runs):
                        # ABBA: a side measured second in a pair came out ~8 us dearer even
                        # when both sides were off (an A/A run), so the order alternates.
                        order = ("off", "on") if index % 2 == 0 else ("on", "off")
                        for side in order:
                            ingress.access.every_app = side == "on" and not control
                            await wrk(url, 1)
                            await shipped(registry, interval)
                            before = access_counts(registry)
                            cpu = time.process_time()
                            requests = await wrk(url, seconds)
                            await shipped(registry, interval)
                            cpu = time.process_time() - cpu
                            after = access_counts(registry)
                            costs[side].append(cpu / requests * 1e6)
                            rates[side].append(requests / seconds)
                            delta = {key: after[key] - before[key] for key in after}
                            note = ""
                            if side == "on":
                                for outcome in OUTCOMES:
                                    outcomes[outcome] += delta[outcome]
                                written.append(delta["written"] / seconds)
                                total_written += delta["written"]
                                note = (
                                    f"  {delta['written'] / seconds:6,.0f} lines/s written, "
                                    f"{delta['sampled'] + delta['capped']:,.0f} of "
                                    f"{requests:,} requests sampled out"
                                )
                            elif delta["written"] or delta["kept"]:
                                sys.exit(f"access lines while off: {delta}")
                            print(
                                f"  {side:4} {requests / seconds:9,.0f} req/s  "
                                f"{cpu / requests * 1e6:6.1f} us CPU/request{note}",
                                flush=True,
                            )
            finally:
                await anyio.to_thread.run_sync(logdir.stop)
    sampled, kept = record_cost(rate)
    base = statistics.median(costs["off"])
    print("  medians (lowest..highest):")
    for side in costs:
        median = statistics.median(costs[side])
        print(
            f"  {side:4} {spread(rates[side], '{:,.0f}')} req/s  "
            f"{spread(costs[side], '{:.1f}')} us CPU/request  "
            f"({median - base:+.1f} us, {median / base - 1:+.1%} against off)"
        )
    paired = [on - off for off, on in zip(costs["off"], costs["on"], strict=True)]
    print(f"  on - off, run by run (each on after its off): {spread(paired, '{:+.1f}')} us")
    total = sum(outcomes.values())
    print(
        f"  on: {spread(written, '{:,.0f}')} access lines/s written; of "
        f"{total:,.0f} requests' lines: "
        + ", ".join(f"{outcome} {outcomes[outcome]:,.0f}" for outcome in OUTCOMES)
        + f" (wakeful_ingress_access_lines_total); {total_written:,.0f} written"
    )
    print(
        f"  AccessLog.record alone: {sampled:.2f} us a call past the rate (sampled out), "
        f"{kept:.2f} us a line kept"
    )


# --------------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> None:
    if args.only in (None, "access") and shutil.which("wrk") is None:
        sys.exit("missing wrk: apt-get install wrk")
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-logs-", dir=args.dir) as name:
        tmp = Path(name)
        print(
            f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
            f"{loadavg()}; logs in {tmp} ({filesystem(tmp)})"
        )
        if args.only in (None, "ingest"):
            await ingestion(tmp, args.seconds, args.rounds, args.nodes)
        if args.only in (None, "http"):
            await over_http(tmp, args.seconds, args.rounds, args.nodes)
        if args.only in (None, "access"):
            await access_cost(tmp, args.access_seconds, args.runs, args.access_rate, args.control)
        print(f"\nload average at the end {loadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3, help="per ingestion run")
    parser.add_argument("--rounds", type=int, default=3, help="ingestion runs per variant")
    parser.add_argument("--nodes", type=int, default=4, help="shippers (HTTP clients) at once")
    parser.add_argument("--access-seconds", type=int, default=5, help="per access log run")
    parser.add_argument("--runs", type=int, default=5, help="access log runs per side")
    parser.add_argument(
        "--access-rate", type=int, default=1000, help="IngressSettings.access_log_rate"
    )
    parser.add_argument("--dir", help="where the temporary log directories go")
    parser.add_argument(
        "--control", action="store_true", help="access: both sides off (A/A), the method's bias"
    )
    parser.add_argument("--only", choices=["ingest", "http", "access"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, args, backend_options={"use_uvloop": True})
