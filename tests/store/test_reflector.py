"""The one list-watch-resync loop (wakeful.store.reflector) on every backend: the view sees the
listing, then each change in order; a record that does not validate counts as absent and never
stops the loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import anyio
import pytest
from pydantic import BaseModel

from wakeful.store import Item, Listing, Store
from wakeful.store.base import WatchItem
from wakeful.store.reflector import Feed, reflect, reflect_all

pytestmark = pytest.mark.anyio


class Thing(BaseModel):
    n: int


class Other(BaseModel):
    text: str


class Recorder:
    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.calls: list[str] = []
        self.changed = anyio.Event()

    def replace(self, items: list[Item[Thing]], revision: int) -> None:
        self.items = {item.key: item.value.n for item in items}
        self.calls.append(f"replace {sorted(self.items.items())}")
        self._changed()

    def put(self, item: Item[Thing]) -> None:
        self.items[item.key] = item.value.n
        self.calls.append(f"put {item.key}={item.value.n}")
        self._changed()

    def delete(self, key: str, revision: int) -> None:
        self.items.pop(key, None)
        self.calls.append(f"delete {key}")
        self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, count: int) -> None:
        with anyio.fail_after(20):
            while len(self.calls) < count:
                await self.changed.wait()


async def test_the_view_gets_the_listing_then_every_change_in_order(store: Store) -> None:
    await store.put("things/a", Thing(n=1))
    await store.put("others/x", Thing(n=9))  # another prefix: never seen
    view = Recorder()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: reflect(store, "things/", Thing, view, what="test"))
        await view.until(1)
        await store.put("things/b", Thing(n=2))
        await store.put("things/a", Thing(n=3))
        await store.delete("things/b")
        await view.until(4)
        tasks.cancel_scope.cancel()
    assert view.calls == [
        "replace [('things/a', 1)]",
        "put things/b=2",
        "put things/a=3",
        "delete things/b",
    ]


async def test_an_invalid_record_counts_as_absent_and_the_loop_goes_on(store: Store) -> None:
    await store.put("things/bad", Other(text="not a thing"))
    await store.put("things/a", Thing(n=1))
    view = Recorder()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: reflect(store, "things/", Thing, view, what="test"))
        await view.until(1)
        await store.put("things/a", Other(text="broken now"))
        await store.put("things/c", Thing(n=5))
        await view.until(3)
        tasks.cancel_scope.cancel()
    assert view.calls == ["replace [('things/a', 1)]", "delete things/a", "put things/c=5"]
    assert view.items == {"things/c": 5}


async def test_several_prefixes_share_one_watch_and_each_view_sees_only_its_own(
    store: Store,
) -> None:
    await store.put("things/a", Thing(n=1))
    await store.put("others/x", Other(text="x"))
    things, others = Recorder(), OtherRecorder()
    listings: list[str] = []
    feeds = [Feed("things/", Thing, things), Feed("others/", Other, others)]
    all_listed = anyio.Event()

    def listed() -> None:
        listings.append(f"{len(things.calls)} {len(others.calls)}")
        all_listed.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: reflect_all(store, feeds, what="test", listed=listed))
        await all_listed.wait()
        await store.put("others/y", Other(text="y"))
        await store.put("things/b", Thing(n=2))
        await store.put("elsewhere/z", Thing(n=7))
        await store.put("things/c", Thing(n=3))
        await things.until(3)
        tasks.cancel_scope.cancel()
    assert things.calls == ["replace [('things/a', 1)]", "put things/b=2", "put things/c=3"]
    assert others.calls == ["replace ['others/x']", "put others/y"]
    assert listings == ["1 1"]  # once, after every view was replaced


async def test_a_change_the_listing_already_held_is_not_replayed(store: Store) -> None:
    """The watch starts from the oldest listing's revision: a feed listed later must not see
    again the writes its own listing contained."""
    await store.put("things/a", Thing(n=1))
    things = Recorder()
    slow = SlowList(store, before="things/", write=("things/a", Thing(n=2)))
    async with anyio.create_task_group() as tasks:
        feeds = [Feed("others/", Other, OtherRecorder()), Feed("things/", Thing, things)]
        tasks.start_soon(lambda: reflect_all(cast(Store, slow), feeds, what="test"))
        await things.until(1)
        await store.put("things/b", Thing(n=5))
        await things.until(2)
        tasks.cancel_scope.cancel()
    assert things.calls == ["replace [('things/a', 2)]", "put things/b=5"]


class OtherRecorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def replace(self, items: list[Item[Other]], revision: int) -> None:
        self.calls.append(f"replace {sorted(item.key for item in items)}")

    def put(self, item: Item[Other]) -> None:
        self.calls.append(f"put {item.key}")

    def delete(self, key: str, revision: int) -> None:
        self.calls.append(f"delete {key}")


class SlowList:
    """The store, except that listing `before` first writes `write`: a change that lands
    between two feeds' listings, so it is in the second listing and after the first's
    revision."""

    def __init__(self, store: Store, *, before: str, write: tuple[str, BaseModel]) -> None:
        self._store = store
        self._before = before
        self._write: tuple[str, BaseModel] | None = write

    async def list(self, prefix: str, model: type[BaseModel]) -> Listing[BaseModel]:
        if prefix == self._before and self._write is not None:
            key, value = self._write
            self._write = None
            await self._store.put(key, value)
        return await self._store.list(prefix, model)

    def watch(self, prefix: str, from_revision: int | None = None) -> AsyncIterator[WatchItem]:
        return self._store.watch(prefix, from_revision)
