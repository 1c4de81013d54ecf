"""What the benchmarks read of processes from /proc: CPU time, children, time spent waiting
for a CPU. Linux only, as the benchmarks are."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command (field 3, the state, first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(*pids: int) -> float:
    """utime + stime of these processes (every thread), from /proc."""
    ticks = 0
    for pid in pids:
        fields = stat(pid)
        ticks += int(fields[11]) + int(fields[12])
    return ticks / TICK


def user_seconds(*pids: int) -> float:
    """utime alone of these processes (every thread): their own code's share, from /proc."""
    return sum(int(stat(pid)[11]) for pid in pids) / TICK


def preempted(*pids: int) -> int:
    """Involuntary context switches of these processes (their main threads), from /proc."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("nonvoluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def children(pid: int) -> list[int]:
    """The process's children as they are now (nginx's workers, a supervisor's), in order."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += map(int, (task / "children").read_text().split())
    return sorted(found)


def with_children(pid: int, count: int = 1, within: float = 5.0) -> list[int]:
    """`pid` and its children once it has `count` of them (nginx's master and its workers:
    the master listens before it forks them, so a port that takes connections does not say
    they are there), or as they are after `within` seconds."""
    deadline = time.monotonic() + within
    while len(found := children(pid)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid, *found]


def ingress_workers(pid: int) -> list[int]:
    """The children of `pid` that are ingress workers (`wakeful ingress`), not sandboxes."""
    found = []
    for child in children(pid):
        with contextlib.suppress(OSError):
            if b"wakeful.cli\0ingress" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


def gone(pid: int) -> bool:
    """The process exited (reaped, or a zombie its parent has not reaped yet)."""
    try:
        return stat(pid)[0] == "Z"
    except FileNotFoundError:
        return True


def waited(*pids: int) -> float:
    """Seconds these processes' threads spent runnable but waiting for a CPU (the run queue:
    other processes in the way), from /proc/PID/task/TID/schedstat."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9
