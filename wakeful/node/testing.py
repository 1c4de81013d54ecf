"""For tests and benchmarks: which processes are a control plane's sandboxes."""

from __future__ import annotations

import os
from pathlib import Path


def sandbox_pids(data_dir: Path) -> list[int]:
    """Processes whose working directory lies under `data_dir`'s sandboxes (Linux /proc)."""
    root = str((data_dir / "sandboxes").resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd").startswith(root):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
