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
4. Wakes, --wakes N per cell (0 skips it): the first request to an app that is warm, suspended
   or stopped. One `wakeful up` (WAKEFUL_LEASE_IDLE_TTL=0.5, so the ingress soon hands an idle
   lease back and the sandbox can be frozen; WAKEFUL_TRACE off) with two apps: examples/hello,
   and "heavy", the same app behind a 1 s sleep before it serves (a Django/Rails/JVM boot);
   each with suspend_delay 1 s, and N copies of each at zero (suspend_delay 0: once woken they
   stay running, and quiet). N rounds; in each, for each app in turn, once both apps'
   sandboxes are frozen (`suspended == 1`, `ready == 0` in /v1/pools; so no freeze runs
   during a sample, and both apps see the same machine), one request (from suspended: a thaw); one
   while the ingress still holds the lease it took (warm); once that lease is handed back
   (`leased == 0`), one more (warm, lease handed back: a thaw has to take a lease too); one to
   a copy at zero (from stopped: a start). Each is sent after 0.2 s of quiet, with the same
   raw-socket client as section 2. p50/p99/max of send -> first byte, how each request woke
   (the `desc` of the `wake` entry of its Server-Timing: thaw, start, or - for none) and the
   statuses; then suspended - warm and stopped - warm per percentile, and under them the
   issue's goal: from suspended, <= 5 ms over a warm request at p50 and <= 15 ms at p99,
   whatever the app's boot time.
Each `wakeful up`'s output is scanned for warning/error lines (--keep-logs DIR keeps it).

Figures only, no assertions. From the repository root, as a module:

    .venv/bin/python -m bench.coldstart [--cold 20] [--apps 10,50,100] [--wakes 20] [--gap S]
        [--keep-logs DIR]

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
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
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
HELLO_COMMAND = ["python3", "app.py"]
HEAVY_COMMAND = [
    "python3",
    "-c",
    "import time; time.sleep(1); import runpy; runpy.run_path('app.py', run_name='__main__')",
]
"""examples/hello behind a 1 s "import" before it serves: a Django/Rails/JVM boot's stand-in."""
LEASE_IDLE_TTL = 0.5
"""Seconds the ingress keeps an idle lease (section 4): a sandbox is frozen only without one."""
QUIET = 0.2
"""Seconds each request of section 4 waits first: what came before has settled (the node's
freeze once the record says suspended, a request's bookkeeping, the pool poll)."""
WAKE = re.compile(rb'\bwake;dur=[0-9.]+(?:;desc="(\w+)")?')


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
    started, done, answer = exchange(port, host)
    return started, done, status_of(answer)


def exchange(port: int, host: str) -> tuple[float, float, bytes]:
    """`first_byte`'s exchange: (sent, first byte of the answer, the whole answer)."""
    request = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(request)
        chunks = [sock.recv(65536)]
        done = time.monotonic()
        while chunks[-1]:  # the rest, so the exchange completes
            chunks.append(sock.recv(65536))
    return started, done, b"".join(chunks)


def status_of(answer: bytes) -> int:
    fields = answer.split(b" ", 2)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def woken_by(answer: bytes) -> str:
    """How a request woke its app, from its answer's `Server-Timing` (`wakeful up` adds it):
    the `desc` of its `wake` entry (thaw, start), "-" without one (it woke nothing)."""
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"server-timing":
            found = WAKE.search(value)
            return "-" if found is None else (found.group(1) or b"?").decode()
    return "no Server-Timing"


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


def make_apps(
    root: Path,
    prefix: str,
    count: int,
    http: bool = True,
    command: list[str] = HELLO_COMMAND,
    suspend_delay: str | None = None,
) -> list[str]:
    """COUNT copies of examples/hello under ROOT (PREFIX1..PREFIXCOUNT), at zero, run by
    `command`; with `suspend_delay` when given (a duration), the default one otherwise."""
    names = [f"{prefix}{i}" for i in range(1, count + 1)]
    health = '[health]\npath = "/healthz"\ntimeout = 30\n' if http else "[health]\ntimeout = 30\n"
    suspend = "" if suspend_delay is None else f'suspend_delay = "{suspend_delay}"\n'
    for name in names:
        shutil.copytree(HELLO, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        (root / name / "wakeful.toml").write_text(
            f'name = "{name}"\ncommand = {json.dumps(command)}\nshutdown_timeout = 5\n'
            + health
            + '[concurrency]\nscale_down_delay = "1h"\nmin_instances = 0\n'
            + suspend
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
def running_up(
    root: Path,
    names: list[str],
    keep_logs: Path | None,
    env: dict[str, str] | None = None,
    idle_interval: float = 0.5,
    proxy: int | None = None,
) -> Iterator[Up]:
    """`wakeful up` on free ports (the ingress on `proxy` when given), with `env` added to its
    environment; on the way out SIGTERM, wait, and reap any sandbox left."""
    data_dir, log = root / "state", root / "wakeful-up.log"
    proxy, api, admin = proxy or free_port(), free_port(), free_port()
    command = [*WAKEFUL, "--data-dir", str(data_dir), "up", *(str(root / n) for n in names)]
    command += ["--listen", f"127.0.0.1:{proxy}", "--api-listen", f"127.0.0.1:{api}"]
    command += ["--admin-listen", f"127.0.0.1:{admin}", "--idle-interval", f"{idle_interval:g}"]
    # WAKEFUL_TRACE: wakeful.aio.trace, where the wake goes
    environment = {**os.environ, "WAKEFUL_TRACE": "1", **(env or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment)
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


@dataclass
class Cell:
    """One row of the wake table: its requests' latencies, how each woke, their statuses."""

    seconds: list[float] = field(default_factory=list)
    woken: collections.Counter[str] = field(default_factory=collections.Counter)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)

    def sample(self, port: int, app: str) -> None:
        time.sleep(QUIET)
        started, done, answer = exchange(port, f"{app}.localhost")
        self.seconds.append(done - started)
        self.woken[woken_by(answer)] += 1
        self.statuses[status_of(answer)] += 1


WAKE_ROWS = [
    ("warm", "warm: ready, the ingress holds a lease"),
    ("released", "warm: ready, its lease handed back"),
    ("suspended", "from suspended: frozen, thawed"),
    ("stopped", "from stopped: at zero, started"),
]
WAKE_DELTAS = [
    ("suspended - warm", "suspended", "warm"),
    ("suspended - warm, its lease handed back", "suspended", "released"),
    ("stopped - warm", "stopped", "warm"),
]
WAKE_APPS = [
    ("hello", HELLO_COMMAND, "hello: examples/hello"),
    ("heavy", HEAVY_COMMAND, 'heavy: examples/hello behind a 1 s sleep ("imports")'),
]


def wait_pool(
    up: Up, app: str, state: Callable[[dict[str, object]], bool], within: float = 60
) -> None:
    """Poll /v1/pools until the app's pool is in `state`."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if any(p["app"] == app and state(p) for p in up.pools()):
                return
        time.sleep(0.05)
    raise RuntimeError(f"{app}: its pool did not get where it was awaited within {within:g} s")


def frozen(pool: dict[str, object]) -> bool:
    return pool["suspended"] == 1 and pool["ready"] == 0


def lease_handed_back(pool: dict[str, object]) -> bool:
    return pool["leased"] == 0 and pool["ready"] == 1 and pool["suspended"] == 0


def wakes(count: int, keep_logs: Path | None) -> None:
    cells: dict[str, dict[str, Cell]] = {}
    with tempfile.TemporaryDirectory(prefix="wakeful-wake-") as tmp:
        root = Path(tmp)
        plan: dict[str, tuple[str, list[str]]] = {}
        for label, command, _ in WAKE_APPS:
            (main,) = make_apps(root, label, 1, command=command, suspend_delay="1s")
            # Copies never frozen: once started they stay running, and idle, beside the samples.
            copies = make_apps(root, f"{label}-stopped", count, command=command, suspend_delay="0s")
            plan[label] = (main, copies)
        names = [name for main, copies in plan.values() for name in (main, *copies)]
        env = {"WAKEFUL_LEASE_IDLE_TTL": str(LEASE_IDLE_TTL), "WAKEFUL_TRACE": "0"}
        # The idle monitor at its default pace (it lists every record on each tick; nothing
        # here scales down): at 0.5 s its ticks would land in samples.
        with running_up(root, names, keep_logs, env, idle_interval=30) as up:
            wait_all_at_zero(up, names)
            port = int(up.proxy.rsplit(":", 1)[1])
            for label, (main, _) in plan.items():
                cells[label] = {kind: Cell() for kind, _ in WAKE_ROWS}
                first_byte(port, f"{main}.localhost")  # its one sandbox, from now on
            # Round by round, the apps in turn: each sees the same machine (the copies started
            # so far run idle beside the samples), and every main app is frozen again before
            # the next one's samples, so no freeze runs during a sample.
            for round_ in range(count):
                for label, (main, copies) in plan.items():
                    row = cells[label]
                    for other, _ in plan.values():
                        wait_pool(up, other, frozen)
                    row["suspended"].sample(port, main)
                    row["warm"].sample(port, main)
                    wait_pool(up, main, lease_handed_back)
                    row["released"].sample(port, main)
                    row["stopped"].sample(port, copies[round_])
    line = "{:<46} {:>8} {:>8} {:>8}  {:<14} {}"
    print(
        f"\nWakes: the first request to an app (send -> first byte), {count} per row;"
        f" suspend_delay 1 s, WAKEFUL_LEASE_IDLE_TTL={LEASE_IDLE_TTL:g}"
    )
    print(line.format("", "p50 ms", "p99 ms", "max ms", "woke by", "statuses"))
    for label, _, title in WAKE_APPS:
        print(title)
        for kind, text in WAKE_ROWS:
            cell = cells[label][kind]
            figures = [f"{pct(cell.seconds, q) * 1e3:.1f}" for q in (0.5, 0.99, 1)]
            woke = ", ".join(f"{how} {n}" for how, n in sorted(cell.woken.items()))
            print(line.format("  " + text, *figures, woke, dict(cell.statuses)))
        for text, kind, base in WAKE_DELTAS:
            over, warm = cells[label][kind].seconds, cells[label][base].seconds
            delta = [f"{(pct(over, q) - pct(warm, q)) * 1e3:.1f}" for q in (0.5, 0.99)]
            print(line.format("  " + text, *delta, "", "", "").rstrip())
    print(
        "  goal: from suspended, <= 5 ms over a warm request at p50 and <= 15 ms at p99,"
        " whatever the app's boot time"
    )
    print("  (woke by: the desc of the wake entry of each answer's Server-Timing; -: none)")
    up.report()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cold", type=int, default=20, help="cold starts (default 20)")
    parser.add_argument("--apps", default="10,50,100", help="N apps woken at once (10,50,100)")
    parser.add_argument(
        "--wakes",
        type=int,
        default=20,
        help="samples per row of the warm/suspended/stopped table (default 20; 0 skips it)",
    )
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
    if args.wakes > 0:
        wakes(args.wakes, args.keep_logs)


if __name__ == "__main__":
    main()
