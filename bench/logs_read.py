"""Benchmark reading the log directory (issue 40): one app's 1,000,000 output lines, asked
through the control API of a real `wakeful activator` for the last minute (`since`), for a
rare marker over everything (`grep`) and for the last 200 lines (`tail`), against the goal of
an answer within 1 s each, and the server's memory (VmRSS) while it answers.

- The directory is written by `wakeful.deploy.logdir.LogDir`, as the control plane writes
  it, in batches of `BATCH` lines: lines of about 100 bytes of text (records of about 230),
  spread evenly over the last `SPAN` seconds (about 70 a second, so the last minute holds a
  few thousand), from 4 sandboxes; segments of the default size, every one but the last
  closed and gzipped. The writer's clock is the lines' own time, as when it wrote them live.
- `MARKERS` lines hold a marker found nowhere else in any line's text, and `DECOYS` lines hold
  it outside their text (in their sandbox's name): a grep searches the text only.
- The server: `wakeful activator` on a SQLite store in a process of its own, with
  WAKEFUL_LOG_DIR pointing at the directory; its VmRSS is read from /proc every few
  milliseconds while it answers.
- The baseline, in the same run: `zgrep -c -F MARKER` over the same segments (the system's
  gzip and grep, one file after another; it counts the decoys too).

From the repository root:

    python -m bench.logs_read [--lines 1000000]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.logs_read")

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from wakeful.deploy import logread
from wakeful.deploy.logdir import LogDir, encode
from wakeful.domain.logfiles import Limits
from wakeful.store.testing import free_port

LINES = 1_000_000
SPAN = 4 * 3600.0
"""Seconds the lines are spread over, ending at the build's start."""
BATCH = 7_000
"""Lines per `LogDir.append` (about 1.5 MiB): a segment (4 MiB) closes every third batch, so
the last two batches stay in the open segment."""
APP = "shop"
MARKER = "needle-5e1f0a"
MARKERS = 25
DECOYS = 3
LAST = 60.0
"""Seconds the `since` question covers: the last minute."""
TAIL = 200
TOKEN = "bench-token"
GOAL = 1.0
"""Seconds an answer should take."""
SAMPLE = 9973
"""Every this many lines, the line formatted is checked against `encode`'s."""
LIMITS = Limits(retention=7 * 86400.0, max_bytes=4 << 30, app_max_bytes=512 << 20)
_WORDS = ("GET", "POST", "PUT", "GET", "GET", "DELETE")
_LEVELS = ("INFO", "INFO", "INFO", "WARN", "INFO", "DEBUG", "INFO", "ERROR")
_PATHS = ("/api/v1/orders", "/api/v1/carts", "/api/v1/users", "/static/app.js", "/healthz")


@dataclass
class Built:
    """A log directory made by `build`, and what its questions must answer, exactly."""

    root: Path
    lines: int
    raw_bytes: int
    """The lines' bytes, uncompressed."""
    stored_bytes: int
    """The segments' bytes on disk."""
    segments: int
    closed: int
    since: float
    """The `since` of the last-minute question: between two lines' times."""
    last_minute: list[bytes] = field(default_factory=list)
    marked: list[bytes] = field(default_factory=list)
    """The lines whose text holds `MARKER`, oldest first."""
    newest: list[bytes] = field(default_factory=list)
    """The last `TAIL` lines."""
    seconds: float = 0.0


def _marked_at(lines: int) -> set[int]:
    """The lines holding the marker: spread over the whole range, one in the last minute."""
    step = lines // MARKERS
    return {step // 3 + k * step for k in range(MARKERS - 1)} | {lines - 17}


def _decoys_at(lines: int) -> set[int]:
    return {lines // 7 + k * (lines // 5) for k in range(DECOYS)}


def _text(i: int, marked: bool) -> str:
    """A line as an app writes one: about 100 bytes, varied, never the marker by chance."""
    mixed = (i * 2654435761) & 0xFFFFFFFF
    level = "ERROR" if marked else _LEVELS[mixed % len(_LEVELS)]
    word = _WORDS[mixed % len(_WORDS)]
    path = _PATHS[(mixed >> 8) % len(_PATHS)]
    status = 500 if marked else (200, 200, 201, 204, 304, 404)[(mixed >> 4) % 6]
    took = (mixed >> 12) % 900 + (mixed % 1000) / 1000
    text = (
        f"{level} {word} {path}/{mixed % 100_000} status={status} took={took:.3f}ms "
        f"user=u{(mixed >> 3) % 50_000:05d} trace={(mixed * 0x9E3779B1) & 0xFFFFFFFFFFFF:012x}"
    )
    return f"{text} ref={MARKER}-{i}" if marked else text


def build(root: Path, lines: int = LINES, end: float | None = None) -> Built:
    """`lines` output lines of `APP` written to the log directory at `root` by one writer,
    the last at `end` (default: now), and the answers to the bench's questions."""
    began = time.perf_counter()
    end = time.time() if end is None else end
    end_us = int(end * 1e6)
    step_us = int(SPAN * 1e6) // lines
    start_us = end_us - step_us * (lines - 1)
    cut = lines - int(LAST * 1e6) // step_us
    since = (start_us + step_us * cut - step_us // 2) / 1e6
    marked, decoys = _marked_at(lines), _decoys_at(lines)
    now = [start_us / 1e6]
    logdir = LogDir(root, "bench", LIMITS, sync=False, clock=lambda: now[0])
    logdir.start()
    built = Built(root, lines, 0, 0, 0, 0, since)
    newest: deque[bytes] = deque(maxlen=TAIL)
    written: concurrent.futures.Future[int] | None = None
    try:
        for first in range(0, lines, BATCH):
            batch = []
            for i in range(first, min(first + BATCH, lines)):
                us = start_us + step_us * i
                ts = round(us / 1e6, 6)
                seconds, micro = divmod(us, 1_000_000)
                sandbox = f"{MARKER}-decoy" if i in decoys else f"shop-v7-{i % 4}a3f"
                # `encode`'s bytes, formatted directly (4x faster; checked every SAMPLE lines):
                # nothing here needs a JSON escape.
                line = (
                    f'{{"ts":{ts!r},"time":"{_clock_text(seconds)}.{micro:06d}Z",'
                    f'"app":"{APP}","version":"v7","sandbox":"{sandbox}","node":"node-{i % 3}",'
                    f'"line":"{_text(i, i in marked)}"}}\n'
                ).encode()
                if i % SAMPLE == 0 and line != encode(json.loads(line)):
                    raise AssertionError(f"not as `encode` writes it: {line!r}")
                batch.append(line)
                if i >= cut:
                    built.last_minute.append(line)
                if i in marked:
                    built.marked.append(line)
                built.raw_bytes += len(line)
            newest.extend(batch[-TAIL:])
            oldest = (start_us + step_us * first) / 1e6
            last = (start_us + step_us * (first + len(batch) - 1)) / 1e6
            if written is not None:  # one append queued at a time: the same segments each run
                _written(written)
            now[0] = last
            written = logdir.append(APP, "output", batch, oldest, last)
        if written is not None:
            _written(written)
    finally:
        logdir.stop()
    built.newest = list(newest)
    for segment in logread.segments(root, APP, "output"):  # as a reader sees them
        built.segments += 1
        built.closed += segment.end is not None
        built.stored_bytes += (logread.folder(root, APP, "output") / segment.name).stat().st_size
    built.seconds = time.perf_counter() - began
    return built


def _written(future: concurrent.futures.Future[int]) -> None:
    dropped = future.result(timeout=60)
    if dropped:
        raise RuntimeError(f"the log writer dropped {dropped} lines while building")


_CLOCK_TEXT: dict[int, str] = {}


def _clock_text(seconds: int) -> str:
    """`2026-12-05T05:40:01` of whole seconds since the epoch (a line's `time`, to seconds)."""
    text = _CLOCK_TEXT.get(seconds)
    if text is None:
        if len(_CLOCK_TEXT) > 4096:
            _CLOCK_TEXT.clear()
        text = _CLOCK_TEXT[seconds] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return text


# -- the server ---------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    pid: int

    def rss(self) -> int:
        """The server's resident memory now, bytes (VmRSS)."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for {self.pid}")


@contextlib.contextmanager
def serving(log_dir: Path, work: Path, within: float = 60.0) -> Iterator[Server]:
    """`wakeful activator` on a SQLite store in `work`, reading `log_dir`, once it leads."""
    listen = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": f"sqlite:///{work / 'store.db'}",
        "WAKEFUL_TOKEN": TOKEN,
        "WAKEFUL_LISTEN": listen,
        "WAKEFUL_LOG_DIR": str(log_dir),
    }
    command = [sys.executable, "-m", "wakeful.cli", "--data-dir", str(work / "data")]
    process = subprocess.Popen(
        [*command, "activator", "--no-idle-monitor"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://{listen}"
        deadline = time.monotonic() + within
        while not _leads(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the activator did not serve: {_said(process)}")
            time.sleep(0.05)
        yield Server(url, process.pid)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def _leads(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _said(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        process.kill()
    return (process.communicate()[0] or "")[-3000:]


@dataclass
class Answer:
    body: bytes
    seconds: float
    peak_rss: int
    """The server's largest VmRSS seen while it answered, bytes."""


def ask(server: Server, params: dict[str, str | int], timeout: float = 300.0) -> Answer:
    """GET the app's log with `params` (as JSON Lines), the server's VmRSS sampled meanwhile."""
    peak = [server.rss()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            with contextlib.suppress(OSError, RuntimeError):
                peak[0] = max(peak[0], server.rss())

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    began = time.perf_counter()
    try:
        answer = httpx.get(
            f"{server.url}/v1/apps/{APP}/logs",
            params={**params, "format": "json"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=timeout,
        )
        seconds = time.perf_counter() - began
    finally:
        done.set()
        sampler.join()
    peak[0] = max(peak[0], server.rss())
    if answer.status_code != 200:
        raise RuntimeError(f"the logs API answered {answer.status_code}: {answer.text[:300]}")
    return Answer(answer.content, seconds, peak[0])


def questions(built: Built) -> dict[str, tuple[dict[str, str | int], list[bytes]]]:
    """Each question's parameters, and the exact lines its answer holds."""
    return {
        "since (last minute)": ({"since": f"{built.since:.6f}"}, built.last_minute),
        "grep (everything)": ({"since": "0", "grep": MARKER}, built.marked),
        f"tail {TAIL}": ({"tail": TAIL}, built.newest),
    }


# -- the bench ----------------------------------------------------------------------------------


def baseline(built: Built) -> tuple[int, float]:
    """`zgrep -c -F MARKER` over the app's segments: the lines counted, and its seconds."""
    where = logread.folder(built.root, APP, "output")
    files = [str(where / segment.name) for segment in logread.segments(built.root, APP, "output")]
    began = time.perf_counter()
    done = subprocess.run(
        ["zgrep", "-c", "-F", "--", MARKER, *files], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - began
    if done.returncode not in (0, 1):
        raise RuntimeError(f"zgrep failed: {done.stderr}")
    counted = sum(int(line.rsplit(":", 1)[1]) for line in done.stdout.splitlines())
    return counted, seconds


def main(lines: int, runs: int) -> None:
    if shutil.which("zgrep") is None:
        sys.exit("missing zgrep: apt-get install gzip")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {lines:,} lines")
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-logs-") as tmp:
        work = Path(tmp)
        built = build(work / "logs", lines)
        print(
            f"built in {built.seconds:.1f} s: {built.raw_bytes / 2**20:,.0f} MiB of lines in "
            f"{built.segments} segments ({built.closed} gzipped), "
            f"{built.stored_bytes / 2**20:,.1f} MiB on disk"
        )
        counted, zgrep_seconds = baseline(built)
        with serving(work / "logs", work) as server:
            before = server.rss()
            print(f"server: wakeful activator, pid {server.pid}, VmRSS {before / 2**20:.1f} MiB")
            print()
            row = "{:<20} {:>8} {:>9} {:>9} {:>9}  {}"
            print(row.format("question", "lines", "best s", "worst s", "RSS +MiB", "goal"))
            peak = before
            for name, (params, expected) in questions(built).items():
                times = []
                for _ in range(runs):
                    answer = ask(server, params)
                    if answer.body != b"".join(expected):
                        sys.exit(f"{name}: the answer is not the lines expected")
                    times.append(answer.seconds)
                    peak = max(peak, answer.peak_rss)
                grown = (peak - before) / 2**20
                verdict = "met" if max(times) <= GOAL else f"MISSED ({GOAL:g} s)"
                print(
                    row.format(
                        name,
                        f"{len(expected):,}",
                        f"{min(times):.3f}",
                        f"{max(times):.3f}",
                        f"{grown:.1f}",
                        verdict,
                    )
                )
        print(
            f"{'zgrep -c (baseline)':<20} {counted:>8,} {zgrep_seconds:>9.3f} "
            f"{'':>9} {'':>9}  (counts the {DECOYS} decoys too: the marker outside a line's text)"
        )
        print(f"server VmRSS grew by {(peak - before) / 2**20:.1f} MiB at most (goal: < 50 MiB)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--runs", type=int, default=3, help="answers timed per question")
    args = parser.parse_args()
    main(args.lines, args.runs)
