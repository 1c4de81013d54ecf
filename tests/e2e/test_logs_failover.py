"""Logs outlive their leader (issue 40): two activators on one etcd share one log directory
(WAKEFUL_LOG_DIR, as they share the artifact directory); an app prints a numbered line ten
times a second. What `wakeful logs` read from the leader is still there, record for record,
once the leader is SIGKILLed and the standby leads; the lines printed after the takeover
arrive too; and each sandbox's lines are whole, in order, none missing and none twice, though
the node's batches in flight at the kill were sent again to the heir."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import deploy, leads, start_cluster, wakeful_cli
from wakeful.domain.logfiles import parse_segment
from wakeful.store.testing import EtcdServer

APP = "ticker"
TICK = re.compile(r"tick (\d+) at (\d+\.\d+)")
TICKER = """\
import os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def tick():
    n = 0
    while True:
        print(f"tick {n} at {time.time():.3f}", flush=True)
        n += 1
        time.sleep(0.1)


server = ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler)
print(f"ticker listening on {os.environ['PORT']}", flush=True)
threading.Thread(target=tick, daemon=True).start()
server.serve_forever()
"""


def _ticker(root: Path) -> Path:
    """An app whose one sandbox (kept up: `min_instances = 1`) prints `tick N at TIME`."""
    where = root / APP
    where.mkdir()
    (where / "app.py").write_text(TICKER)
    (where / "wakeful.toml").write_text(
        f'name = "{APP}"\ncommand = ["python3", "app.py"]\n'
        '[health]\npath = "/healthz"\ntimeout = 30\n'
        "[concurrency]\nmin_instances = 1\nmax_instances = 1\n"
    )
    return where


def _read(apis: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Every record of the app's output, as `wakeful logs APP --json --since 1h` prints them."""
    done = wakeful_cli(apis, env, "logs", APP, "--json", "--since", "1h", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _ticks(records: list[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(sandbox, N, printed at) of each tick line, a line cut into pieces (`"more"`) joined."""
    found = []
    held: dict[str, str] = {}
    for record in records:
        if "sandbox" not in record:
            continue
        text = held.pop(record["sandbox"], "") + record["line"]
        if record.get("more"):
            held[record["sandbox"]] = text
            continue
        if tick := TICK.fullmatch(text):
            found.append((record["sandbox"], int(tick[1]), float(tick[2])))
    return found


def _wait_for(
    read: Callable[[], list[dict[str, Any]]],
    done: Callable[[list[dict[str, Any]]], bool],
    within: float,
    what: str,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    while True:
        records = read()
        if done(records):
            return records
        assert time.monotonic() < deadline, f"{what}: not within {within:g} s; read {records}"
        time.sleep(0.5)


@pytest.mark.etcd
def test_lines_logged_before_the_leader_is_sigkilled_are_read_from_its_heir(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    processes: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    logs = tmp_path / "logs"
    with start_cluster(
        etcd_server.url,
        tmp_path,
        nodes=("n1",),
        activators=2,
        processes=processes,
        activator_urls=urls,
        role_env={"activator": {"WAKEFUL_LOG_DIR": str(logs)}},
    ) as (api, _proxy, env):
        heir = urls[1]
        deploy(api, env, _ticker(tmp_path))
        before = _wait_for(
            lambda: _read(api, env),
            lambda records: len(_ticks(records)) >= 30,
            60,
            "30 ticks read from the leader",
        )
        assert leads(api) and not leads(heir)

        processes[0].send_signal(signal.SIGKILL)
        processes[0].wait(timeout=30)
        deadline = time.monotonic() + 60
        while not leads(heir):
            assert time.monotonic() < deadline, "the standby never took over"
            time.sleep(0.1)
        took_over = time.time()

        # Through the CLI given both APIs, the dead one first: it finds the heir.
        after = _wait_for(
            lambda: _read(f"{api},{heir}", env),
            lambda records: any(at > took_over + 1 for _, _, at in _ticks(records)),
            90,
            "a tick printed after the takeover",
        )

    missing = [record for record in before if record not in after]
    assert not missing, f"{len(missing)} lines read from the leader are gone: {missing[:3]}"
    ticks = _ticks(after)
    sandboxes = {sandbox for sandbox, _, _ in ticks}
    for sandbox in sandboxes:
        numbers = [n for s, n, _ in ticks if s == sandbox]
        twice = sorted({n for n in numbers if numbers.count(n) > 1})
        assert not twice, f"{sandbox}: ticks read twice: {twice}"
        assert numbers == list(range(len(numbers))), f"{sandbox}: ticks out of order or missing"
    # Nothing was lost between the two (the log's own notes say so when it is).
    assert not [r for r in after if "wakeful" in r or "output missing" in r.get("line", "")]
    # Both leaders wrote into the one directory, each its own segments (named after its term:
    # the heir appends to files of its own name, never to the dead leader's).
    segments = [
        parse_segment(APP, "output", e.name) for e in (logs / "apps" / APP / "output").iterdir()
    ]
    writers = {segment.writer for segment in segments if segment is not None}
    assert len(writers) == 2 and all(re.fullmatch(r"t\d+", w) for w in writers), writers
    print(
        f"{len(before)} lines read from the leader, {len(after)} from its heir; "
        f"{len(sandboxes)} sandbox(es); writers {sorted(writers)}"
    )
