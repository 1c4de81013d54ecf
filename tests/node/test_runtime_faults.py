"""A sandbox whose log file cannot be written (a full disk) keeps running: its output is still
drained and forwarded, and what the file missed is counted, not raised."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from wakeful.node.runtime import ProcessRuntime

pytestmark = pytest.mark.anyio


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled up (mounting needs root; CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        with (mount / "filler").open("wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


async def test_output_on_a_full_disk_is_forwarded_counted_and_never_fatal(
    full_disk: Path, tmp_path: Path
) -> None:
    lines = 2000
    script = f"for n in range({lines}): print('line', n, 'x' * 100, flush=True)"
    process = await ProcessRuntime().start(
        [sys.executable, "-c", script], {"PATH": os.environ["PATH"]}, tmp_path, full_disk / "o.log"
    )
    forwarded = bytearray()
    await process.pump(forwarded.extend)
    assert await process.wait() == 0
    assert forwarded.count(b"\n") == lines
    assert process.dropped > 0
    assert process.tail().endswith(f"line {lines - 1} " + "x" * 100)
