"""A SQLite store several processes open (`wakeful up`'s ingress workers open its file): each
one's watchers see the others' writes as they see their own, in revision order, and a TTL
lease of a process that died expires in the others' housekeeping; their housekeeping never
moves the compaction point back."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from pydantic import BaseModel

from wakeful.store import Event, WatchItem, open_store, sqlite_url
from wakeful.store.base import RawPut
from wakeful.store.local import Compacted
from wakeful.store.sqlite import SqliteEngine

pytestmark = pytest.mark.anyio

WRITER = """
import asyncio, sys
from pydantic import BaseModel
from wakeful.store import open_store

class Counter(BaseModel):
    n: int

async def main() -> None:
    async with open_store(sys.argv[1]) as store:
        lease = await store.grant(1)
        await store.put("shared/held", Counter(n=-1), lease=lease)
        for n in range(5):
            await store.put(f"shared/{n}", Counter(n=n))
        print("written", flush=True)
        while True:
            await store.keep_alive(lease)
            await asyncio.sleep(0.2)

asyncio.run(main())
"""


class Counter(BaseModel):
    n: int


async def _next(events: AsyncIterator[WatchItem]) -> Event:
    with anyio.fail_after(10):  # the look is every 50 ms: this is a loaded machine's margin
        item = await anext(events)
    assert isinstance(item, Event), item
    return item


async def test_writes_of_another_process_reach_watchers_here_and_its_lease_expires_when_it_dies(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "store.db")
    offset = 0.0
    async with open_store(url, clock=lambda: time.time() + offset) as store:
        events = store.watch("shared/", (await store.list("shared/", Counter)).revision + 1)
        await store.put("shared/here", Counter(n=0))
        # The watch has read the engine once and waits: only a look at the file wakes it now.
        assert (await _next(events)).key == "shared/here"
        writer = await anyio.open_process(
            [sys.executable, "-c", WRITER, url], env={**os.environ, "PYTHONPATH": os.getcwd()}
        )
        try:
            assert writer.stdout is not None
            with anyio.fail_after(30):
                line = await BufferedByteReceiveStream(writer.stdout).receive_until(b"\n", 100)
            assert line == b"written"
            seen = [await _next(events) for _ in range(6)]
        except BaseException:
            writer.kill()
            await writer.wait()
            raise
        assert [e.key for e in seen] == ["shared/held"] + [f"shared/{n}" for n in range(5)]
        revisions = [e.revision for e in seen]
        assert revisions == sorted(revisions) and len(set(revisions)) == 6
        assert (await store.get("shared/held", Counter)) is not None

        writer.kill()  # SIGKILL: its keep-alives stop; nothing revokes the lease
        await writer.wait()
        offset = 5.0  # past its deadline on this process's clock
        deleted = await _next(events)
        assert (deleted.kind, deleted.key) == ("delete", "shared/held")
        await events.aclose()


async def test_two_stores_on_one_file_see_each_others_writes_interleaved_in_order(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "store.db")
    async with open_store(url) as one, open_store(url) as other:
        start = (await one.list("k/", Counter)).revision + 1
        watches = [one.watch("k/", start), other.watch("k/", start)]
        for n in range(6):  # each watch waits between two writes: a look must wake it
            writer = one if n % 2 else other
            revision = await writer.put(f"k/{n}", Counter(n=n))
            for events in watches:
                event = await _next(events)
                assert (event.key, event.revision) == (f"k/{n}", revision)
        for events in watches:
            await events.aclose()


def test_the_compaction_point_never_moves_back_when_two_processes_compact(
    tmp_path: Path,
) -> None:
    """Every process on the file compacts in its housekeeping. One that checked the point
    before another's compaction committed once wrote its older point over the newer one:
    the events between were gone and a watcher reading there was told nothing (no Resync)."""
    path = tmp_path / "store.db"
    here, there = SqliteEngine(path), SqliteEngine(path, busy_timeout=10)
    for n in range(200):
        here.commit([], [RawPut(f"k/{n}", b"x", None)])
    other = sqlite3.connect(str(path), isolation_level=None)  # a third process, mid-compaction
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("DELETE FROM events WHERE revision < 100")
        other.execute("UPDATE meta SET value = 100 WHERE name = 'compacted'")
        behind = threading.Thread(target=there.compact, args=(90,))
        behind.start()  # it waits for the lock the third one holds
        time.sleep(0.3)
        other.execute("COMMIT")
        behind.join()
    finally:
        other.close()
    with pytest.raises(Compacted):
        here.changes("", 95, 10)
    here.close()
    there.close()


async def test_a_write_here_after_an_unseen_write_elsewhere_loses_neither(tmp_path: Path) -> None:
    """This process's write must not be taken into the tail from its own ops when another
    process wrote in between (its revision is not the tail's next): both reach the watcher,
    in order."""
    url = sqlite_url(tmp_path / "store.db")
    async with open_store(url, shared=False) as here, open_store(url) as other:
        events = here.watch("k/", (await here.list("k/", Counter)).revision + 1)
        first = await here.put("k/0", Counter(n=0))
        assert (await _next(events)).revision == first
        theirs = await other.put("k/other", Counter(n=1))  # `here` does not look for it
        mine = await here.put("k/mine", Counter(n=2))
        seen = [await _next(events) for _ in range(2)]
        assert [(e.key, e.revision) for e in seen] == [("k/other", theirs), ("k/mine", mine)]
        await events.aclose()
