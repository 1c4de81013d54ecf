"""For tests and benchmarks: the command line of a `wakeful up` on given loopback ports."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


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
