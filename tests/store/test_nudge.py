"""The kernel's word of writes to a shared store file (`store.nudge`): a write by another
connection (another process's, as `wakeful up`'s workers) reaches watchers here at once, not
at the next look of an interval; with no word to be had, the interval's looks still do."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from wakeful.store import Event, WatchItem, local, open_store, sqlite_url
from wakeful.store.nudge import IN_MODIFY, IN_Q_OVERFLOW, FileNudge, events

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


async def _next(watch: AsyncIterator[WatchItem]) -> Event:
    with anyio.fail_after(10):  # far past the nudge's few ms, far short of the interval
        item = await anext(watch)
    assert isinstance(item, Event), item
    return item


def test_a_read_of_the_descriptor_gives_each_event_s_mask_and_name() -> None:
    def event(mask: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name))
        return struct.pack("iIII", 1, mask, 0, len(padded)) + padded

    buffer = event(IN_MODIFY, b"store.db-wal") + event(IN_Q_OVERFLOW, b"") + event(2, b"x")
    assert list(events(buffer)) == [(IN_MODIFY, b"store.db-wal"), (IN_Q_OVERFLOW, b""), (2, b"x")]


async def test_a_write_to_the_file_or_its_wal_nudges_and_one_to_another_file_does_not(
    tmp_path: Path,
) -> None:
    nudge = FileNudge(tmp_path / "store.db")
    assert nudge.start()
    try:
        (tmp_path / "other.log").write_bytes(b"x")
        assert not await nudge.wait(0.3)
        for name in ("store.db-wal", "store.db"):
            (tmp_path / name).write_bytes(b"x")
            with anyio.fail_after(10):
                assert await nudge.wait(30)
    finally:
        nudge.close()


async def test_a_store_file_named_through_a_link_nudges_from_where_sqlite_writes(
    tmp_path: Path,
) -> None:
    """SQLite puts the WAL beside the file a link names, under that file's name."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link.db").symlink_to(tmp_path / "real" / "store.db")
    nudge = FileNudge(tmp_path / "link.db")
    assert nudge.start()
    try:
        (tmp_path / "real" / "store.db-wal").write_bytes(b"x")
        with anyio.fail_after(10):
            assert await nudge.wait(30)
    finally:
        nudge.close()


async def test_another_connection_s_write_reaches_a_waiting_watcher_without_an_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interval an hour long: only the kernel's word can wake the look in time."""
    monkeypatch.setattr(local, "NUDGED_LOOK", 3600.0)
    url = sqlite_url(tmp_path / "store.db")
    async with open_store(url) as here, open_store(url) as there:
        watch = here.watch("k/", (await here.list("k/", Counter)).revision + 1)
        for n in range(3):
            revision = await there.put(f"k/{n}", Counter(n=n))
            event = await _next(watch)
            assert (event.key, event.revision) == (f"k/{n}", revision)
        await watch.aclose()


async def test_with_no_word_from_the_kernel_the_interval_s_looks_still_see_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FileNudge, "start", lambda self: False)
    url = sqlite_url(tmp_path / "store.db")
    async with open_store(url) as here, open_store(url) as there:
        watch = here.watch("k/", (await here.list("k/", Counter)).revision + 1)
        revision = await there.put("k/0", Counter(n=0))
        event = await _next(watch)
        assert (event.key, event.revision) == ("k/0", revision)
        await watch.aclose()
