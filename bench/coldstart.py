"""Benchmark cold starts through `wakeful up`, against the app's own start-to-ready time.

1. Baseline: `python3 app.py` (examples/hello, PORT set) spawned directly, /healthz probed
   every ~0.5 ms; the time from spawn to the first 200.
2. Cold starts: one `wakeful up` with COLD copies of examples/hello (cold1..coldN, all at
   zero). One GET per app through the ingress (Host: coldI.localhost, a fresh connection),
   timed from send to the answer's first byte, with the same raw-socket client as the
   baseline's probe (an HTTP library's own overhead would count against wakeful). Baseline and
   cold samples alternate, so both see the same machine. Overhead = first-request latency -
   baseline, at p50 and at p99; then each phase of the wake, from WAKEFUL_TRACE marks.
3. For each N in --apps: a fresh `wakeful up` with N apps at zero, one request per app all at
   once; successes/N and p50/p95 latency, then SIGTERM and a check that no sandbox is left.
Each `wakeful up`'s output is scanned for warning/error lines (--keep-logs DIR keeps it).

Figures only, no assertions. From the repository root, as a module:

    .venv/bin/python -m bench.coldstart [--cold 20] [--apps 10,50,100] [--gap S] [--keep-logs DIR]

`--gap S` waits S seconds before each cold-start sample. Back to back (0, the default), each
baseline and each wake shares the CPU with the warm-slot refill of the wake before it (a
bwrap and a Python start, ~50 ms of one core, 20 ms after that wake settled); with a gap of
0.3 s every sample starts on a quiet machine, as a single wake does.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.coldstart")

import argparse
import collections
import contextlib
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
from subprocess import DEVNULL

import anyio
import httpx

from wakeful.node.testing import sandbox_pids
from wakeful.store.testing import free_port

HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello"
APP_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"
"""The interpreter a sandbox's `python3` is (its PATH is fixed): the baseline starts the same."""
PHASES = [
    ("request sent -> routed (ingress)", "send", "routed"),
    ("routed -> parked (lease cache, activator)", "routed", "wait"),
    ("parked -> scale-up written", "wait", "scale_up"),
    ("scale-up -> placed (controller)", "scale_up", "placed"),
    ("placed -> claimed (node agent)", "placed", "claimed"),
    ("claimed -> prepared (records, artifact)", "claimed", "prepared"),
    ("prepared -> booting written", "prepared", "booting"),
    ("booting -> spawned (uid, tmpfs, unpack, exec)", "booting", "spawned"),
    ("spawned -> first probe ok (app boot + probe)", "spawned", "probed"),
    ("probe ok -> ready record written", "probed", "ready"),
    ("ready record -> routable (activator view)", "ready", "routable"),
    ("routable -> lease granted", "routable", "lease"),
    ("lease granted -> held by the ingress", "lease", "leased"),
    ("held -> answer head (connect, app)", "leased", "answered"),
    ("answer head -> first byte at the client", "answered", "done"),
]
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
MARKS = ("ERROR", "CRITICAL", "WARNING", "Traceback")
PROBE = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (with 20 samples, p99 is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def healthz_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(PROBE)
            return sock.recv(64).split(b" ", 2)[1:2] == [b"200"]
    except OSError:
        return False


def first_byte(port: int, host: str) -> tuple[float, float, int]:
    """GET / through the ingress on a fresh connection, with the same raw-socket client as
    the baseline's probe: (sent, first byte of the answer, status), on the monotonic clock."""
    request = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(request)
        answer = sock.recv(65536)
        done = time.monotonic()
        while sock.recv(65536):  # the rest, so the exchange completes
            pass
    fields = answer.split(b" ", 2)
    return started, done, int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def baseline_once(http: bool = True) -> float:
    port, started = free_port(), time.perf_counter()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PORT": str(port)}
    app = subprocess.Popen(
        [APP_PYTHON, "app.py"], cwd=HELLO, env=env, stdout=DEVNULL, stderr=DEVNULL
    )
    ready = healthz_ok if http else listening
    try:
        while not ready(port):
            if app.poll() is not None or time.perf_counter() - started > 30:
                raise RuntimeError(f"the app alone did not get ready (exit {app.returncode})")
            time.sleep(0.0005)
        return time.perf_counter() - started
    finally:
        stop(app, 10)


def stop(process: subprocess.Popen[bytes], grace: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def make_apps(root: Path, prefix: str, count: int, http: bool = True) -> list[str]:
    names = [f"{prefix}{i}" for i in range(1, count + 1)]
    health = '[health]\npath = "/healthz"\ntimeout = 30\n' if http else "[health]\ntimeout = 30\n"
    for name in names:
        shutil.copytree(HELLO, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        (root / name / "wakeful.toml").write_text(
            f'name = "{name}"\ncommand = ["python3", "app.py"]\nshutdown_timeout = 5\n'
            + health
            + '[concurrency]\nscale_down_delay = "1h"\nmin_instances = 0\n'
        )
    return names


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    data_dir: Path
    proxy: str
    api: str
    stop_seconds: float = math.nan
    at_exit: int = 0  # sandbox processes still alive the moment `wakeful up` exited
    left: list[int] = field(default_factory=list)  # ... and 10 s later (then killed)
    issues: list[str] = field(default_factory=list)  # warning/error lines of its output
    traces: dict[str, dict[str, float]] = field(default_factory=dict)  # app -> event -> t

    def pools(self) -> list[dict[str, object]]:
        auth = {"Authorization": f"Bearer {(self.data_dir / 'token').read_text().strip()}"}
        answer = httpx.get(f"{self.api}/v1/pools", headers=auth, timeout=30)
        answer.raise_for_status()
        pools: list[dict[str, object]] = answer.json()
        return pools

    def sandbox_pids(self) -> list[int]:
        return sandbox_pids(self.data_dir)

    def report(self) -> None:
        print(
            f"      wakeful up: exit code {self.process.returncode}, stopped in"
            f" {self.stop_seconds:.1f} s, sandboxes alive at its exit: {self.at_exit},"
            f" 10 s later: {len(self.left)},"
            f" warning/error lines in its output: {len(self.issues)}"
        )
        for line in self.issues[:5]:
            print(f"      | {line[:160]}")


@contextlib.contextmanager
def running_up(root: Path, names: list[str], keep_logs: Path | None) -> Iterator[Up]:
    """`wakeful up` on free ports; on the way out SIGTERM, wait, and reap any sandbox left."""
    data_dir, log = root / "state", root / "wakeful-up.log"
    proxy, api, admin = free_port(), free_port(), free_port()
    command = [*WAKEFUL, "--data-dir", str(data_dir), "up", *(str(root / n) for n in names)]
    command += ["--listen", f"127.0.0.1:{proxy}", "--api-listen", f"127.0.0.1:{api}"]
    command += ["--admin-listen", f"127.0.0.1:{admin}", "--idle-interval", "0.5"]
    env = {**os.environ, "WAKEFUL_TRACE": "1"}  # wakeful.domain.trace: where the wake goes
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    up = Up(process, data_dir, f"http://127.0.0.1:{proxy}", f"http://127.0.0.1:{api}")
    try:
        deadline = time.monotonic() + 60
        while not (data_dir / "control.json").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"wakeful up did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield up
    finally:
        started = time.perf_counter()
        stop(process, 60)
        up.stop_seconds = time.perf_counter() - started
        up.at_exit = len(up.sandbox_pids())
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
        up.traces = traces(lines)
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, keep_logs / f"wakeful-up-{root.name}.log")


def wait_all_at_zero(up: Up, names: list[str], within: float = 300) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            pools = {str(p["app"]): p for p in up.pools()}
            if all(n in pools and pools[n]["live"] == 0 for n in names):
                return
        time.sleep(0.1)
    raise RuntimeError(f"not every app was deployed at zero within {within:g} s")


def traces(lines: list[str]) -> dict[str, dict[str, float]]:
    """app -> event -> monotonic time, from `trace EVENT app=APP t=T` lines (first of each)."""
    found: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for line in lines:
        _, marker, rest = line.partition(" trace ")
        if not marker:
            continue
        event, app, at = rest.split()[:3]
        found[app.removeprefix("app=")].setdefault(event, float(at.removeprefix("t=")))
    return found


def cold_starts(count: int, keep_logs: Path | None, http: bool = True, gap: float = 0.0) -> None:
    base: list[float] = []
    first: list[float] = []
    sent: dict[str, tuple[float, float]] = {}
    statuses: collections.Counter[int] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="wakeful-cold-") as tmp:
        names = make_apps(Path(tmp), "cold", count, http)
        with running_up(Path(tmp), names, keep_logs) as up:
            wait_all_at_zero(up, names)
            port = int(up.proxy.rsplit(":", 1)[1])
            for name in names:
                time.sleep(gap)  # the node's warm-slot refill after the last wake settles first
                base.append(baseline_once(http))
                started, done, status = first_byte(port, f"{name}.localhost")
                first.append(done - started)
                sent[name] = (started, done)
                statuses[status] += 1
    row = "{:<46} {:>8} {:>8} {:>8}"
    kind = "HTTP /healthz" if http else "TCP connect"
    print(f"\nCold starts ({kind} readiness): {count} apps at zero, one request each")
    print(row.format("", "p50 ms", "p99 ms", "max ms"))
    alone = f"app alone: spawn -> ready ({kind})"
    for label, values in ((alone, base), ("through wakeful: first request, first byte", first)):
        print(row.format(label, *(f"{pct(values, q) * 1e3:.1f}" for q in (0.5, 0.99, 1))))
    over = [f"{(pct(first, q) - pct(base, q)) * 1e3:.1f}" for q in (0.5, 0.99)]
    print(row.format("overhead (wakeful - alone, per percentile)", *over, ""))
    paired = [f - b for f, b in zip(first, base, strict=True)]
    print(
        row.format(
            "  paired: each request - the baseline beside it",
            *(f"{pct(paired, q) * 1e3:.1f}" for q in (0.5, 0.99, 1)),
        )
    )
    print("  where the time goes (each phase's own percentiles; from WAKEFUL_TRACE):")
    for label, start, end in PHASES:
        spans = []
        for name, (began, ended) in sent.items():
            events = {**up.traces.get(name, {}), "send": began, "done": ended}
            if start in events and end in events:
                spans.append(events[end] - events[start])
        if spans:
            print(row.format("  " + label, *(f"{pct(spans, q) * 1e3:.1f}" for q in (0.5, 0.99, 1))))
    print(f"      statuses: {dict(statuses)}")
    up.report()


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
    row = "{:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>12}"
    print(row.format("N", "ok/N", "p50 ms", "p95 ms", "max ms", "burst s", "ready after"))
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix=f"wakeful-burst{n}-") as tmp:
            names = make_apps(Path(tmp), "app", n)
            with running_up(Path(tmp), names, keep_logs) as up:
                wait_all_at_zero(up, names)
                started = time.perf_counter()
                results = anyio.run(burst, up.proxy, names)
                wall = time.perf_counter() - started
                ready = sum(int(str(p["ready"])) for p in up.pools())
        ok = [seconds * 1e3 for outcome, seconds in results if outcome == "200"]
        every = [seconds * 1e3 for _, seconds in results]
        figures = [f"{pct(every, q):.0f}" for q in (0.5, 0.95, 1)]
        print(row.format(n, f"{len(ok)}/{n}", *figures, f"{wall:.1f}", ready))
        if len(ok) < n:
            outcomes = dict(collections.Counter(outcome for outcome, _ in results))
            print(f"      outcomes: {outcomes}; successes: p50 {pct(ok, 0.5):.0f} ms")
        if wall > 180:
            print(f"      NOTE: the burst took more than 3 minutes ({wall:.0f} s)")
        up.report()
    print("  (latency percentiles over every request; ready after = sandboxes ready after it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cold", type=int, default=20, help="cold starts (default 20)")
    parser.add_argument("--apps", default="10,50,100", help="N apps woken at once (10,50,100)")
    parser.add_argument("--keep-logs", type=Path, help="copy each `wakeful up` output here")
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds between cold-start samples (0: back to back, each baseline and wake then "
        "sharing the CPU with the warm-slot refill of the wake before it)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up on SIGTERM too
    sizes = [int(part) for part in args.apps.split(",") if part.strip()]
    apps_python = subprocess.run([APP_PYTHON, "-V"], capture_output=True, text=True, check=True)
    print(
        f"wakeful cold start: Python {platform.python_version()} (control plane),"
        f" {apps_python.stdout.strip()} (apps), {platform.machine()}, {os.cpu_count()} cores"
        f" ({len(os.sched_getaffinity(0))} usable)"
    )
    if args.cold > 0:
        cold_starts(args.cold, args.keep_logs, http=True, gap=args.gap)
        cold_starts(args.cold, args.keep_logs, http=False, gap=args.gap)
    if sizes:
        woken_at_once(sizes, args.keep_logs)


if __name__ == "__main__":
    main()
