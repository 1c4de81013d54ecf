"""A wakeful process started with signals ignored (`nohup wakeful up &`) keeps ignoring them,
and passes none of them on to what it starts."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import os, signal, subprocess
import anyio
from wakeful.process import signals_caught

signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup and a background job leave them
signal.signal(signal.SIGQUIT, signal.SIG_IGN)

async def main():
    with signals_caught():
        os.kill(os.getpid(), signal.SIGHUP)  # still without effect here
        os.kill(os.getpid(), signal.SIGQUIT)
        await anyio.sleep(0.1)
        child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True)
        print(next(line for line in child.stdout.splitlines() if line.startswith("SigIgn:")))

anyio.run(main)
"""


def test_signals_a_wakeful_process_was_started_ignoring_are_not_passed_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr  # SIGHUP and SIGQUIT did not end it
    mask = int(done.stdout.split()[-1], 16)
    assert mask & (1 << 0) == 0, done.stdout  # SIGHUP (1) not ignored in the child
    assert mask & (1 << 2) == 0, done.stdout  # SIGQUIT (3)
