"""Store helpers for tests: time passed for the embedded stores' TTLs, a SQLite write lock held
from outside."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Sandbox, SandboxStatus
from wakeful.store import Store
from wakeful.store.local import LocalStore
from wakeful.testing import ManualClock


def hold_write_lock(path: Path) -> sqlite3.Connection:
    """What another process does to the file: take the write lock and keep it."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


async def pass_time(store: Store, clock: ManualClock | None, seconds: float) -> None:
    """Let `seconds` pass for the store's TTLs: move the clock and run the embedded store's
    housekeeping (so what is due expires now, not at its next tick), or on etcd really wait."""
    if clock is None:
        await anyio.sleep(seconds)
        return
    clock.advance(seconds)
    assert isinstance(store, LocalStore)
    await store.housekeep()


async def routable(store: Store, sandbox_id: str, pool: str, app: str = "web") -> None:
    """A sandbox of `pool` running and ready (as a node would report it): what a rollout
    waits for before it flips."""
    await store.put(
        keys.sandbox(sandbox_id),
        Sandbox(
            id=sandbox_id,
            pool=pool,
            app=app,
            status=SandboxStatus.RUNNING,
            ready=True,
            address="127.0.0.1:9",
        ),
    )
