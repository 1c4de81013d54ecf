"""How long an idle app takes to reach zero after its last request, through `wakeful up`.

    python -m bench.scale_to_zero [--delay 10] [--idle-interval 30] [--runs 3]

Starts `wakeful up` with the sample app at the given scale_down_delay and idle-monitor tick,
sends one request (a cold start), then measures from the response to (a) the pool's
desired_instances reaching 0 and (b) no sandbox process left. The expectation is about
scale_down_delay plus up to one tick (plus the activator's activity write, at most a third of
the delay). Prints each run and the mean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from wakeful.node.testing import sandbox_pids
from wakeful.store.testing import free_port
from wakeful.testing import up_command

HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello"


def one_run(delay: float, idle_interval: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="wakeful-bench-") as tmp:
        root = Path(tmp)
        app = root / "hello"
        shutil.copytree(HELLO, app)
        manifest = (app / "wakeful.toml").read_text()
        (app / "wakeful.toml").write_text(
            manifest.replace('scale_down_delay = "60s"', f"scale_down_delay = {delay}")
        )
        data_dir = root / "state"
        proxy, api, admin = free_port(), free_port(), free_port()
        command = up_command(
            data_dir, [app], proxy=proxy, api=api, admin=admin, idle_interval=idle_interval
        )
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            control = data_dir / "control.json"
            while not control.exists():
                time.sleep(0.05)
            token = json.loads(control.read_text())["token"]
            answer = httpx.get(
                f"http://127.0.0.1:{proxy}/", headers={"Host": "hello.localhost"}, timeout=60
            )
            answer.raise_for_status()
            last = time.monotonic()
            at_zero = gone = None
            headers = {"Authorization": f"Bearer {token}"}
            while gone is None:
                time.sleep(0.1)
                pools = httpx.get(f"http://127.0.0.1:{api}/v1/pools", headers=headers).json()
                if at_zero is None and pools[0]["desired_instances"] == 0:
                    at_zero = time.monotonic() - last
                if at_zero is not None and not sandbox_pids(data_dir):
                    gone = time.monotonic() - last
            assert at_zero is not None
            return at_zero, gone
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=10.0, help="scale_down_delay, seconds")
    parser.add_argument("--idle-interval", type=float, default=30.0, help="idle monitor tick")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores; scale_down_delay "
        f"{args.delay:g} s, idle monitor tick {args.idle_interval:g} s"
    )
    zeros, gones = [], []
    for run in range(1, args.runs + 1):
        at_zero, gone = one_run(args.delay, args.idle_interval)
        zeros.append(at_zero)
        gones.append(gone)
        print(f"run {run}: desired 0 after {at_zero:.1f} s, no process after {gone:.1f} s")
    print(
        f"mean: desired 0 after {statistics.mean(zeros):.1f} s, no process after "
        f"{statistics.mean(gones):.1f} s (expected about {args.delay:g} + up to "
        f"{args.idle_interval:g} + {args.delay / 3:.1f})"
    )


if __name__ == "__main__":
    main()
