"""A sandbox whose log file cannot be written (a full disk) keeps running: its output is still
drained and forwarded, and what the file missed is counted, not raised."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.faults import fill, small_filesystem
from wakeful.node.sandbox.local import ProcessRuntime

pytestmark = pytest.mark.anyio


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB filesystem, filled up."""
    with small_filesystem(tmp_path / "small", "64k") as mount:
        fill(mount)
        yield mount


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
