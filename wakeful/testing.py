"""For tests and benchmarks: a clock you drive, and the command line of a `wakeful up` on given
loopback ports."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


class ManualClock:
    """A clock that moves only when told: pass it wherever a component takes `clock`, then
    `advance()` past a deadline instead of sleeping until it."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock does not go back (advance by {seconds})")
        self.now += seconds
        return self.now


def up_command(
    data_dir: Path,
    apps: Sequence[Path],
    *,
    proxy: int,
    api: int,
    admin: int,
    idle_interval: float,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "wakeful.cli",
        "--data-dir",
        str(data_dir),
        "up",
        *map(str, apps),
        "--listen",
        f"127.0.0.1:{proxy}",
        "--api-listen",
        f"127.0.0.1:{api}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--idle-interval",
        str(idle_interval),
    ]
