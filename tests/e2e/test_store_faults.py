"""`wakeful up` while its embedded store is unusable: locked by another process for 10 s, or
on a full disk. Invariant 19: the process stays up, warm traffic keeps being served from
cached leases throughout, and the platform writes again once the cause is gone.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.faults import fill, small_filesystem
from tests.support.up import Up, make_app, start_up, stop_up

pytestmark = pytest.mark.anyio
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


async def probe(up: Up, seconds: float) -> list[int]:
    """Sequential requests to the warm app for `seconds`; the status of each."""
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=up.proxy, timeout=30) as http:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                statuses.append((await http.get("/", headers=up.host())).status_code)
            except httpx.TransportError:
                statuses.append(0)
            await anyio.sleep(0.02)
    return statuses


def deploy(up: Up, app: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, "--data-dir", str(up.data_dir), "deploy", str(app)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def assert_serves_a_new_app(up: Up, root: Path) -> None:
    """Writes work again: a deploy creates a version and a pool, a request wakes it."""
    done = deploy(up, make_app(root, "second"))
    assert done.returncode == 0, done.stdout + done.stderr
    async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as http:
        answer = await http.get("/", headers=up.host("second"))
    assert answer.status_code == 200


async def test_a_store_locked_for_10_s_slows_nothing_warm_and_kills_nothing(
    tmp_path: Path,
) -> None:
    up = start_up(tmp_path, make_app(tmp_path))
    try:
        statuses = await probe(up, 0.5)  # warm: a sandbox runs, the ingress holds a lease
        holder = sqlite3.connect(up.data_dir / "store.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            statuses += await probe(up, 10)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert up.process.poll() is None, stop_up(up)
        assert statuses and set(statuses) == {200}, statuses
        await assert_serves_a_new_app(up, tmp_path)
    finally:
        output = stop_up(up)
    assert "Traceback" not in output, output


@pytest.fixture
def small_data_dir(tmp_path: Path) -> Iterator[Path]:
    """The data directory on a 16 MiB filesystem, so a test can fill its disk."""
    with small_filesystem(tmp_path / "small", "16m") as mount:
        yield mount


async def test_a_full_disk_serves_warm_apps_and_recovers(
    tmp_path: Path, small_data_dir: Path
) -> None:
    up = start_up(small_data_dir, make_app(tmp_path))
    try:
        statuses = await probe(up, 0.5)
        filler = fill(small_data_dir)
        refused = deploy(up, make_app(tmp_path / "full", "refused"))
        statuses += await probe(up, 3)
        assert up.process.poll() is None, stop_up(up)
        assert set(statuses) == {200}, statuses
        # A write on a full disk fails with a reason, never a crash or a 500 page.
        assert refused.returncode != 0
        assert "503" in refused.stderr, refused.stderr
        assert "No space left on device" in refused.stderr, refused.stderr
        filler.unlink()
        await assert_serves_a_new_app(up, tmp_path)
    finally:
        stop_up(up)
