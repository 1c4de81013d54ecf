"""The one list-watch-resync loop (wakeful.store.reflector) on every backend: the view sees the
listing, then each change in order; a record that does not validate counts as absent and never
stops the loop."""

from __future__ import annotations

import anyio
import pytest
from pydantic import BaseModel

from wakeful.store import Item, Store
from wakeful.store.reflector import reflect

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
