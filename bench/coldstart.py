"""Benchmark cold starts through `wakeful up`, against the app's own start-to-ready time.

1. Baseline: `python3 app.py` (examples/hello, PORT set) spawned directly, /healthz probed
   every ~2 ms; the time from spawn to the first 200.
2. Cold starts: one `wakeful up` with COLD copies of examples/hello (cold1..coldN, all at
   zero). One GET per app through the ingress (Host: coldI.localhost, a fresh connection),
   timed from send to the full response. Baseline and cold samples alternate, so both see the
   same machine. Overhead = first-request latency - baseline, at p50 and at p99.
3. For each N in --apps: a fresh `wakeful up` with N apps at zero, one request per app all at
   once; successes/N and p50/p95 latency, then SIGTERM and a check that no sandbox is left.

Figures only, no assertions. From the repository root, as a module:

    .venv/bin/python -m bench.coldstart [--cold 20] [--apps 10,50,100] [--keep-logs DIR]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.coldstart")

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

from store.testing import free_port

HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello"
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
MARKS = ("ERROR", "CRITICAL", "WARNING", "Traceback")


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def healthz_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(64).split(b" ", 2)[1:2] == [b"200"]
    except OSError:
        return False


def baseline_once() -> float:
    port = free_port()
    started = time.perf_counter()
    app = subprocess.Popen(
        ["python3", "app.py"],
        cwd=HELLO,
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not healthz_ok(port):
            if app.poll() is not None or time.perf_counter() - started > 30:
                raise RuntimeError(f"baseline app not ready (exit code {app.returncode})")
            time.sleep(0.002)
        return time.perf_counter() - started
    finally:
        app.terminate()
        try:
            app.wait(10)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()


def make_apps(root: Path, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}{i}" for i in range(1, count + 1)]
    for name in names:
        shutil.copytree(HELLO, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        (root / name / "wakeful.toml").write_text(
            f'name = "{name}"\ncommand = ["python3", "app.py"]\nshutdown_timeout = 5\n'
            '[health]\npath = "/healthz"\ntimeout = 30\n'
            '[concurrency]\nscale_down_delay = "1h"\nmin_instances = 0\n'
        )
    return names


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    proxy: str = ""
    api: str = ""
    token: str = ""
    stop_seconds: float = math.nan
    left: list[int] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)

    def pools(self) -> list[dict[str, object]]:
        auth = {"Authorization": f"Bearer {self.token}"}
        answer = httpx.get(f"{self.api}/v1/pools", headers=auth, timeout=30)
        answer.raise_for_status()
        pools: list[dict[str, object]] = answer.json()
        return pools

    def sandbox_pids(self) -> list[int]:
        root = str((self.data_dir / "sandboxes").resolve())
        found = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and os.readlink(entry / "cwd").startswith(root):
                    found.append(int(entry.name))
        return found


@contextlib.contextmanager
def running_up(root: Path, names: list[str], keep_logs: Path | None) -> Iterator[Up]:
    """`wakeful up` on free ports; on the way out SIGTERM, wait, and reap any sandbox left."""
    data_dir, log = root / "state", root / "wakeful-up.log"
    proxy, api, admin = free_port(), free_port(), free_port()
    command = [*WAKEFUL, "--data-dir", str(data_dir), "up", *(str(root / n) for n in names)]
    command += ["--listen", f"127.0.0.1:{proxy}", "--api", f"127.0.0.1:{api}"]
    command += ["--admin", f"127.0.0.1:{admin}", "--idle-interval", "0.5"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    up = Up(process, data_dir, log, f"http://127.0.0.1:{proxy}", f"http://127.0.0.1:{api}")
    try:
        deadline = time.monotonic() + 60
        while not (data_dir / "control.json").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"wakeful up did not start:\n{log.read_text()}")
            time.sleep(0.05)
        time.sleep(0.05)  # the file is written in one go; give the write a moment
        up.token = json.loads((data_dir / "control.json").read_text())["token"]
        yield up
    finally:
        started = time.perf_counter()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        up.stop_seconds = time.perf_counter() - started
        for _ in range(200):  # sandboxes get SIGTERM, then a moment to go
            up.left = up.sandbox_pids()
            if not up.left:
                break
            time.sleep(0.05)
        for pid in up.left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        lines = log.read_text(errors="replace").splitlines()
        up.issues = [line for line in lines if any(mark in line for mark in MARKS)]
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, keep_logs / f"wakeful-up-{root.name}.log")


def wait_all_at_zero(up: Up, names: list[str], within: float = 300) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < within:
        pools = {str(p["app"]): p for p in up.pools()}
        if all(n in pools and pools[n]["live"] == 0 for n in names):
            return time.perf_counter() - started
        time.sleep(0.1)
    raise RuntimeError(f"not every app was deployed at zero within {within:g} s")


def print_issues(up: Up, verbose: bool = True) -> None:
    found = up.issues
    if verbose or found or up.process.returncode != 0:
        print(
            f"      wakeful up: exit code {up.process.returncode}, stopped in"
            f" {up.stop_seconds:.1f} s, sandboxes left after stop: {len(up.left)},"
            f" warning/error log lines: {len(found)}"
        )
    for line in found[:5]:
        print(f"      | {line[:160]}")


def cold_starts(count: int, keep_logs: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="wakeful-cold-") as tmp:
        root = Path(tmp)
        names = make_apps(root, "cold", count)
        base: list[float] = []
        first: list[float] = []
        outcomes: collections.Counter[str] = collections.Counter()
        no_keepalive = httpx.Limits(max_keepalive_connections=0)
        with running_up(root, names, keep_logs) as up:
            wait_all_at_zero(up, names)
            with httpx.Client(base_url=up.proxy, timeout=120, limits=no_keepalive) as client:
                for name in names:
                    base.append(baseline_once())
                    started = time.perf_counter()
                    answer = client.get("/", headers={"Host": f"{name}.localhost"})
                    first.append(time.perf_counter() - started)
                    outcomes[str(answer.status_code)] += 1
    row = "{:<40} {:>9} {:>9} {:>9}"
    print(f"\nCold starts: {count} apps at zero, one request each, a fresh connection each")
    print(row.format("", "p50 ms", "p99 ms", "max ms"))
    for label, values in (
        ("app alone: spawn -> first /healthz 200", base),
        ("through wakeful: first request", first),
    ):
        print(row.format(label, *(f"{pct(values, q) * 1000:.1f}" for q in (0.5, 0.99, 1.0))))
    diff = [(pct(first, q) - pct(base, q)) * 1000 for q in (0.5, 0.99)]
    print(
        row.format("overhead (difference of percentiles)", f"{diff[0]:.1f}", f"{diff[1]:.1f}", "")
    )
    print(f"      statuses: {dict(outcomes)}")
    print_issues(up)


async def burst(proxy: str, names: list[str]) -> list[tuple[str, float]]:
    results: list[tuple[str, float]] = []
    limits = httpx.Limits(max_connections=len(names) + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=proxy, timeout=120, limits=limits) as client:

        async def one(name: str) -> None:
            started = time.perf_counter()
            try:
                answer = await client.get("/", headers={"Host": f"{name}.localhost"})
                outcome = str(answer.status_code)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            results.append((outcome, time.perf_counter() - started))

        async with anyio.create_task_group() as tasks:
            for name in names:
                tasks.start_soon(one, name)
    return results


def woken_at_once(sizes: list[int], keep_logs: Path | None) -> None:
    print("\nN apps woken at once: one request per app, all sent together (timeout 120 s)")
    row = "{:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9} {:>7} {:>7}"
    print(
        row.format(
            "N",
            "ok/N",
            "p50 ms",
            "p95 ms",
            "max ms",
            "burst s",
            "ready",
            "deploy s",
            "stop s",
            "left",
        )
    )
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix=f"wakeful-burst{n}-") as tmp:
            names = make_apps(Path(tmp), "app", n)
            with running_up(Path(tmp), names, keep_logs) as up:
                deployed = wait_all_at_zero(up, names)
                started = time.perf_counter()
                results = anyio.run(burst, up.proxy, names)
                wall = time.perf_counter() - started
                ready = sum(int(str(p["ready"])) for p in up.pools())
        ok = [seconds for outcome, seconds in results if outcome == "200"]
        every = [seconds * 1000 for _, seconds in results]
        figures = [f"{pct(every, q):.0f}" for q in (0.5, 0.95, 1.0)]
        print(
            row.format(
                n,
                f"{len(ok)}/{n}",
                *figures,
                f"{wall:.1f}",
                ready,
                f"{deployed:.1f}",
                f"{up.stop_seconds:.1f}",
                len(up.left),
            )
        )
        outcomes = collections.Counter(outcome for outcome, _ in results)
        if len(ok) < n:
            print(
                f"      outcomes: {dict(outcomes)}; successes only: p50 "
                f"{pct(ok, 0.5) * 1000:.0f} ms, p95 {pct(ok, 0.95) * 1000:.0f} ms"
            )
        if wall > 180:
            print(f"      NOTE: the burst took more than 3 minutes ({wall:.0f} s)")
        print_issues(up, verbose=False)
    print(
        "  (latency percentiles are over every request; ready = sandboxes ready after the"
        " burst;\n   deploy = time until every app's pool was at zero; left = sandboxes left"
        " after stop)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cold", type=int, default=20, help="cold starts (default 20)")
    parser.add_argument("--apps", default="10,50,100", help="N apps woken at once, e.g. 10,50")
    parser.add_argument("--keep-logs", type=Path, help="copy each `wakeful up` log here")
    args = parser.parse_args()
    sizes = [int(part) for part in args.apps.split(",") if part.strip()]
    python3 = subprocess.run(["python3", "--version"], capture_output=True, text=True, check=True)
    print(
        f"wakeful cold-start benchmark: Python {platform.python_version()} (control plane),"
        f" {python3.stdout.strip()} (apps), {platform.machine()},"
        f" {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable)"
    )
    if args.cold > 0:
        cold_starts(args.cold, args.keep_logs)
    if sizes:
        woken_at_once(sizes, args.keep_logs)


if __name__ == "__main__":
    main()
