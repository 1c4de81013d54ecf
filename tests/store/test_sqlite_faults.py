"""The embedded store when its file misbehaves: locked by another process, or on a full disk.

Invariant 19: a store error never ends a process. Every `sqlite3` error leaves the backend as
the store's own `Unavailable` (which every loop already retries), the housekeeping loop backs
off and goes on, and the store works again once the cause is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from tests.support.faults import fill, small_filesystem
from tests.support.store import hold_write_lock
from wakeful.store import Unavailable
from wakeful.store.local import LocalStore
from wakeful.store.sqlite import SqliteEngine
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


async def test_a_locked_database_is_unavailable_not_an_sqlite_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = LocalStore(SqliteEngine(path, busy_timeout=0.05), threaded=True)
    try:
        await store.put("pools/a", Counter(n=1))
        holder = hold_write_lock(path)
        with pytest.raises(Unavailable, match="locked"):
            await store.put("pools/a", Counter(n=2))
        with pytest.raises(Unavailable, match="locked"):
            await store.grant(5)
        # Reads go on beside the writer (WAL).
        found = await store.get("pools/a", Counter)
        assert found is not None and found.value.n == 1
        holder.execute("ROLLBACK")
        holder.close()
        await store.put("pools/a", Counter(n=3))
        found = await store.get("pools/a", Counter)
        assert found is not None and found.value.n == 3
    finally:
        await store.aclose()


async def test_housekeeping_survives_a_held_lock_and_expires_leases_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store.db"
    clock = ManualClock()
    store = LocalStore(SqliteEngine(path, busy_timeout=0.01), threaded=True, clock=clock, tick=0.01)
    lease = await store.grant(1)
    await store.put("nodes/n1", Counter(n=1), lease=lease)
    caplog.set_level(logging.WARNING, logger="wakeful.store.local")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(store.run)
        holder = hold_write_lock(path)
        clock.advance(5)  # the lease is due, but the expiry cannot write
        with anyio.fail_after(30):
            while "housekeeping failed" not in caplog.text:  # noqa: ASYNC110 - a log, no event
                await anyio.sleep(0.01)
        assert await store.get("nodes/n1", Counter) is not None
        holder.execute("ROLLBACK")
        holder.close()
        with anyio.fail_after(30):
            while await store.get("nodes/n1", Counter) is not None:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        tasks.cancel_scope.cancel()
    await store.aclose()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem: the disk a store fills."""
    with small_filesystem(tmp_path / "small", "1m") as mount:
        yield mount


async def test_a_full_disk_is_unavailable_and_the_store_recovers_when_space_returns(
    small_disk: Path,
) -> None:
    store = LocalStore(SqliteEngine(small_disk / "store.db"), threaded=True)
    try:
        await store.put("pools/a", Counter(n=0))
        filler = fill(small_disk)
        big = "x" * 100_000
        with pytest.raises(Unavailable, match=r"full|disk"):  # noqa: PT012 - writes until full
            for n in range(50):
                await store.put(f"apps/a{n}", _Blob(data=big))
        # The failed commit left no transaction open: reads work, and writes do once there
        # is room again.
        assert await store.get("pools/a", Counter) is not None
        filler.unlink()
        await store.put("pools/a", Counter(n=7))
        found = await store.get("pools/a", Counter)
        assert found is not None and found.value.n == 7
    finally:
        await store.aclose()


class _Blob(BaseModel):
    data: str
