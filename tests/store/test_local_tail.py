"""The local store's in-memory tail of the event log (wakeful.store.local): a watcher that falls
behind it reads the engine and crosses into it with nothing lost or repeated, and trimming it
never splits a revision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from wakeful.store import Event, Put, Store, WatchItem, local, open_store

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


@pytest.fixture(params=["memory", "sqlite"])
async def small_tail_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Store]:
    monkeypatch.setattr(local, "TAIL_EVENTS", 5)  # trimmed every few writes
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url) as store:
        yield store


async def take(stream: AsyncIterator[WatchItem], count: int) -> list[tuple[str, int]]:
    found = []
    with anyio.fail_after(30):
        async for item in stream:
            assert isinstance(item, Event), item
            found.append((item.key, item.revision))
            if len(found) == count:
                break
    return found


async def test_a_watcher_from_before_the_tail_gets_everything_once(
    small_tail_store: Store,
) -> None:
    store = small_tail_store
    start = (await store.list("t/", Counter)).revision + 1
    live = store.watch("t/", start)  # keeps the tail read, so it moves and is trimmed
    written: list[tuple[str, int]] = []
    for n in range(40):
        keys = [f"t/{n}{part}" for part in "abc"[: 3 - min(n % 4, 2)]]  # 3, 2, 1, 1 keys
        revision = await store.txn([], [Put(key, Counter(n=n)) for key in keys])
        written += [(key, revision) for key in keys]
        # From each recent revision (the tail was just trimmed, maybe inside one of them)
        # and from the first (long before the tail): everything since, once.
        revisions = sorted({rev for _, rev in written})
        for begin in {revisions[0], *revisions[-4:]}:
            late = store.watch("t/", begin)
            expected = [(key, rev) for key, rev in written if rev >= begin]
            assert await take(late, len(expected)) == expected, begin
            await late.aclose()  # type: ignore[attr-defined]
    assert await take(live, len(written)) == written
    following = await store.put("t/last", Counter(n=99))
    assert await take(live, 1) == [("t/last", following)]
    await live.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
async def test_a_write_reaches_caught_up_watchers_without_reading_the_engine(
    url: str, tmp_path: Path
) -> None:
    """A cold start is a chain of writes each awaited by the next piece's watcher: a put's
    events come from the write itself, and the engine's log is read only when the write
    cannot tell (a delete, which makes an event only if the key existed)."""
    url = url if url == "memory://" else f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url) as store:
        assert isinstance(store, local.LocalStore)
        engine = store._engine
        reads = 0
        changes = engine.changes

        def counted(prefix: str, from_revision: int, span: int) -> tuple[list[Event], int]:
            nonlocal reads
            reads += 1
            return changes(prefix, from_revision, span)

        engine.changes = counted  # type: ignore[method-assign]
        start = await store.put("t/0", Counter(n=0)) + 1
        watchers = [store.watch("t/", start) for _ in range(3)]
        first = await store.put("t/a", Counter(n=1))
        assert [await take(w, 1) for w in watchers] == [[("t/a", first)]] * 3
        before = reads
        second = await store.txn([], [Put("t/c", Counter(n=2)), Put("t/b", Counter(n=3))])
        expected = [("t/b", second), ("t/c", second)]
        assert [await take(w, 2) for w in watchers] == [expected] * 3
        assert reads == before, "a put's watchers read the engine"
        await store.delete("t/a")
        assert [(await take(w, 1))[0][0] for w in watchers] == ["t/a"] * 3
        assert reads == before + 1, "a delete is read from the engine once for every watcher"
        for watcher in watchers:
            await watcher.aclose()  # type: ignore[attr-defined]
