"""The node agent's sandbox writer against a real store: it decides a write from the record as
it last read or wrote it, and a record another writer moved meanwhile is read again, both for a
write (the compare-and-set fails) and for a refusal (never decided from what it last saw)."""

from __future__ import annotations

import pytest

from wakeful.domain import keys
from wakeful.domain.lifecycle import Transition as T
from wakeful.domain.models import Sandbox
from wakeful.domain.models import SandboxStatus as S
from wakeful.node.writer import SandboxWriter
from wakeful.store import Store

pytestmark = pytest.mark.anyio
KEY = keys.sandbox("sb-1")


async def started(store: Store, status: S = S.BOOTING) -> SandboxWriter:
    placed = Sandbox(
        id="sb-1", pool="web-v1", app="web", node="n1", owner="n1", epoch=1, status=status
    )
    await store.create(KEY, placed)
    writer = SandboxWriter(store, "n1")
    writer.started("sb-1", 1, await store.get(KEY, Sandbox))
    return writer


async def move(store: Store, **update: object) -> None:
    item = await store.get(KEY, Sandbox)
    assert item is not None
    await store.update(KEY, item.value.model_copy(update=update), item.revision)


async def current(store: Store) -> Sandbox:
    item = await store.get(KEY, Sandbox)
    assert item is not None
    return item.value


async def test_a_write_after_another_writers_change_keeps_that_change(store: Store) -> None:
    writer = await started(store)
    await move(store, last_activity=42.0)  # the activator's activity write
    assert await writer.change("sb-1", T.READY, address="127.0.0.1:1", ready=True)
    now = await current(store)
    assert (now.status, now.ready, now.last_activity) == (S.RUNNING, True, 42.0)


async def test_a_refusal_is_decided_from_the_record_as_it_is_now(store: Store) -> None:
    writer = await started(store)
    assert await writer.change("sb-1", T.READY, address="127.0.0.1:1", ready=True)
    await move(store, status=S.STOPPING, ready=False)  # the pool controller stops it
    # From the record it last wrote (running), "stopped" is not a legal step; from the
    # record as it is (stopping), it is.
    assert await writer.change("sb-1", T.STOPPED, exit_code=0)
    assert (await current(store)).status is S.STOPPED


async def test_a_record_whose_ownership_moved_is_never_written(store: Store) -> None:
    writer = await started(store)
    await move(store, owner=None, epoch=2)  # marked dead elsewhere, ownership released
    assert not await writer.change("sb-1", T.READY, address="127.0.0.1:1", ready=True)
    now = await current(store)
    assert (now.status, now.owner, now.epoch) == (S.BOOTING, None, 2)
