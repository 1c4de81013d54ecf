"""The store contract: every backend (memory, sqlite, etcd) passes these same tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from pydantic import BaseModel

from tests.support.store import pass_time
from wakeful.store import (
    AlreadyExists,
    Conflict,
    CorruptValue,
    Delete,
    Event,
    InvalidKey,
    LeaseNotFound,
    Put,
    Require,
    Resync,
    Store,
    ValueTooLarge,
    WatchItem,
)
from wakeful.store.base import MAX_VALUE_BYTES
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


class Blob(BaseModel):
    text: str


async def collect(
    stream: AsyncIterator[WatchItem], count: int, within: float = 10
) -> list[WatchItem]:
    found: list[WatchItem] = []
    with anyio.fail_after(within):
        async for item in stream:
            found.append(item)
            if len(found) == count or isinstance(item, Resync):
                break
    return found


async def test_put_get_round_trip_with_revisions(store: Store) -> None:
    assert await store.get("a/x", Counter) is None
    first = await store.put("a/x", Counter(n=1))
    second = await store.put("a/x", Counter(n=2))
    assert second > first
    item = await store.get("a/x", Counter)
    assert item is not None
    assert (item.key, item.value, item.revision) == ("a/x", Counter(n=2), second)


async def test_create_refuses_a_present_key_and_writes_nothing(store: Store) -> None:
    revision = await store.create("a/x", Counter(n=1))
    with pytest.raises(AlreadyExists) as caught:
        await store.create("a/x", Counter(n=2))
    assert caught.value.current_revision == revision
    item = await store.get("a/x", Counter)
    assert item is not None and item.value.n == 1 and item.revision == revision


async def test_update_with_a_stale_revision_conflicts_and_writes_nothing(store: Store) -> None:
    first = await store.create("a/x", Counter(n=1))
    second = await store.update("a/x", Counter(n=2), expect_revision=first)
    with pytest.raises(Conflict) as caught:
        await store.update("a/x", Counter(n=3), expect_revision=first)
    assert caught.value.current_revision == second
    assert caught.value.expected_revision == first
    item = await store.get("a/x", Counter)
    assert item is not None and item.value.n == 2 and item.revision == second


async def test_update_of_an_absent_key_conflicts_with_revision_zero(store: Store) -> None:
    with pytest.raises(Conflict) as caught:
        await store.update("a/missing", Counter(n=1), expect_revision=5)
    assert caught.value.current_revision == 0
    assert await store.get("a/missing", Counter) is None


async def test_delete_conditional_and_unconditional(store: Store) -> None:
    revision = await store.put("a/x", Counter(n=1))
    with pytest.raises(Conflict):
        await store.delete("a/x", expect_revision=revision + 100)
    assert await store.get("a/x", Counter) is not None
    assert await store.delete("a/x", expect_revision=revision) is True
    assert await store.get("a/x", Counter) is None
    assert await store.delete("a/x") is False


async def test_list_returns_only_the_prefix_sorted_with_the_listing_revision(
    store: Store,
) -> None:
    for key in ["pools/b", "pools/a", "poolsx/c", "apps/a"]:
        await store.put(key, Counter(n=len(key)))
    latest = await store.put("pools/c", Counter(n=0))
    listing = await store.list("pools/", Counter)
    assert [item.key for item in listing.items] == ["pools/a", "pools/b", "pools/c"]
    assert listing.revision >= latest
    assert all(item.revision <= listing.revision for item in listing.items)
    assert (await store.list("nothing/", Counter)).items == []


async def test_concurrent_creators_of_one_key_have_exactly_one_winner(store: Store) -> None:
    winners: list[int] = []
    losers: list[int] = []

    async def create(n: int) -> None:
        try:
            await store.create("race/key", Counter(n=n))
            winners.append(n)
        except AlreadyExists:
            losers.append(n)

    async with anyio.create_task_group() as tasks:
        for n in range(20):
            tasks.start_soon(create, n)
    assert len(winners) == 1 and len(losers) == 19
    item = await store.get("race/key", Counter)
    assert item is not None and item.value.n == winners[0]


async def test_concurrent_updates_from_one_revision_have_exactly_one_winner(
    store: Store,
) -> None:
    base = await store.create("race/key", Counter(n=0))
    winners: list[int] = []
    conflicts: list[Conflict] = []

    async def update(n: int) -> None:
        try:
            await store.update("race/key", Counter(n=n), expect_revision=base)
            winners.append(n)
        except Conflict as exc:
            conflicts.append(exc)

    async with anyio.create_task_group() as tasks:
        for n in range(1, 21):
            tasks.start_soon(update, n)
    assert len(winners) == 1 and len(conflicts) == 19
    item = await store.get("race/key", Counter)
    assert item is not None and item.value.n == winners[0]
    assert all(exc.current_revision == item.revision for exc in conflicts)


async def test_txn_is_all_or_nothing(store: Store) -> None:
    a = await store.put("route/a", Counter(n=1))
    await store.put("route/b", Counter(n=1))
    with pytest.raises(Conflict) as caught:
        await store.txn(
            [Require("route/a", a), Require("route/b", 1)],
            [Put("route/a", Counter(n=2)), Delete("route/b"), Put("route/c", Counter(n=2))],
        )
    assert caught.value.key == "route/b"
    assert (await store.get("route/a", Counter)).value.n == 1  # type: ignore[union-attr]
    assert await store.get("route/b", Counter) is not None
    assert await store.get("route/c", Counter) is None

    revision = await store.txn(
        [Require("route/a", a), Require("route/c", 0)],
        [Put("route/a", Counter(n=2)), Delete("route/b"), Put("route/c", Counter(n=2))],
    )
    item_a, item_c = await store.get("route/a", Counter), await store.get("route/c", Counter)
    assert item_a is not None and item_c is not None
    assert item_a.revision == item_c.revision == revision
    assert await store.get("route/b", Counter) is None


async def test_watch_yields_changes_in_order_with_their_revisions(store: Store) -> None:
    listing = await store.list("w/", Counter)
    stream = store.watch("w/", listing.revision + 1)
    r1 = await store.put("w/a", Counter(n=1))
    await store.put("other/a", Counter(n=9))
    r2 = await store.update("w/a", Counter(n=2), expect_revision=r1)
    r3 = await store.put("w/b", Counter(n=3))
    await store.delete("w/a")
    events = await collect(stream, 4)
    assert all(isinstance(event, Event) for event in events)
    seen = [(e.kind, e.key, e.revision) for e in events if isinstance(e, Event)]
    assert seen[:3] == [("put", "w/a", r1), ("put", "w/a", r2), ("put", "w/b", r3)]
    assert seen[3][:2] == ("delete", "w/a") and seen[3][2] > r3
    assert isinstance(events[2], Event) and events[2].decode(Counter) == Counter(n=3)
    await stream.aclose()  # type: ignore[attr-defined]


async def test_watch_from_a_past_revision_replays_the_gap(store: Store) -> None:
    start = await store.put("w/a", Counter(n=1))
    await store.put("w/b", Counter(n=2))
    await store.delete("w/a")
    stream = store.watch("w/", start)
    events = await collect(stream, 3)
    assert [(e.kind, e.key) for e in events if isinstance(e, Event)] == [
        ("put", "w/a"),
        ("put", "w/b"),
        ("delete", "w/a"),
    ]
    assert events[0].revision == start
    # and it keeps going live after the replay
    live = await store.put("w/c", Counter(n=3))
    (event,) = await collect(stream, 1)
    assert isinstance(event, Event) and (event.key, event.revision) == ("w/c", live)
    await stream.aclose()  # type: ignore[attr-defined]


async def test_many_watchers_see_every_change_once_and_in_order(store: Store) -> None:
    """Twelve watchers on overlapping prefixes, watching while writes (some of several keys
    at one revision) go on: each gets exactly its prefix's events, in revision order."""
    start = (await store.list("m/", Counter)).revision + 1
    prefixes = ["m/", "m/a/", "m/b/", "m/a/x"] * 3
    streams = [store.watch(prefix, start) for prefix in prefixes]
    plan = [[f"m/{'ab'[i % 2]}/{'xy'[i % 3 % 2]}{i % 5}"] for i in range(120)]
    for i in range(0, 120, 10):
        plan[i] = [f"m/a/x{i}", f"m/b/y{i}", f"m/a/z{i}"]  # one transaction, one revision
    written: list[tuple[str, int]] = []
    expected = {
        prefix: sum(1 for keys in plan for key in keys if key.startswith(prefix))
        for prefix in prefixes
    }
    seen: dict[int, list[WatchItem]] = {}
    async with anyio.create_task_group() as tasks:
        for index, (prefix, stream) in enumerate(zip(prefixes, streams, strict=True)):

            async def consume(index: int, stream: AsyncIterator[WatchItem], count: int) -> None:
                seen[index] = await collect(stream, count, within=60)

            tasks.start_soon(consume, index, stream, expected[prefix])
        for n, keys in enumerate(plan):
            revision = await store.txn([], [Put(key, Counter(n=n)) for key in sorted(keys)])
            written += [(key, revision) for key in sorted(keys)]
            if n % 7 == 0:
                await anyio.sleep(0.001)  # let the watchers fall behind and catch up
    for index, prefix in enumerate(prefixes):
        got = [(e.key, e.revision) for e in seen[index] if isinstance(e, Event)]
        assert got == [(key, rev) for key, rev in written if key.startswith(prefix)], prefix
    for stream in streams:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_watch_from_a_compacted_revision_yields_resync(store: Store) -> None:
    old = await store.put("w/a", Counter(n=1))
    await store.put("w/a", Counter(n=2))
    latest = await store.put("w/a", Counter(n=3))
    await store.compact(latest)
    stream = store.watch("w/", old)
    items = await collect(stream, 1)
    assert len(items) == 1 and isinstance(items[0], Resync)
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_ttl_expiry_deletes_the_key_and_emits_a_delete(
    store: Store, ttl_clock: ManualClock | None
) -> None:
    lease = await store.grant(2)
    revision = await store.put("nodes/n1", Counter(n=1), lease=lease)
    stream = store.watch("nodes/", revision + 1)
    await pass_time(store, ttl_clock, 3)
    (event,) = await collect(stream, 1, within=15)
    assert isinstance(event, Event) and (event.kind, event.key) == ("delete", "nodes/n1")
    assert await store.get("nodes/n1", Counter) is None
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease)
    await stream.aclose()  # type: ignore[attr-defined]


async def test_keep_alive_holds_a_ttl_key_and_revoke_deletes_it(
    store: Store, ttl_clock: ManualClock | None
) -> None:
    lease = await store.grant(2)
    revision = await store.put("nodes/n1", Counter(n=1), lease=lease)
    stream = store.watch("nodes/", revision + 1)
    for _ in range(4):  # 4 s: twice the TTL
        await pass_time(store, ttl_clock, 1)
        await store.keep_alive(lease)
    assert await store.get("nodes/n1", Counter) is not None
    await store.revoke(lease)
    (event,) = await collect(stream, 1)
    assert isinstance(event, Event) and (event.kind, event.key) == ("delete", "nodes/n1")
    assert await store.get("nodes/n1", Counter) is None
    await store.revoke(lease)  # idempotent
    await stream.aclose()  # type: ignore[attr-defined]


async def test_a_put_on_an_unknown_lease_is_refused(store: Store) -> None:
    with pytest.raises(LeaseNotFound):
        await store.put("nodes/n1", Counter(n=1), lease=987654321)
    assert await store.get("nodes/n1", Counter) is None


@pytest.mark.parametrize(
    "key",
    ["", "/abs", "trailing/", "a//b", "../up", "a/./b", "sp ace", "é", "x" * 600, "nl\n"],
    ids=[
        "empty",
        "absolute",
        "trailing-slash",
        "empty-segment",
        "dotdot",
        "dot",
        "space",
        "non-ascii",
        "too-long",
        "a trailing newline",
    ],
)
async def test_invalid_keys_get_a_typed_error_and_write_nothing(store: Store, key: str) -> None:
    with pytest.raises(InvalidKey):
        await store.put(key, Counter(n=1))
    with pytest.raises(InvalidKey):
        await store.get(key, Counter)
    assert (await store.list("", Counter)).items == []


async def test_oversized_values_get_a_typed_error_and_write_nothing(store: Store) -> None:
    with pytest.raises(ValueTooLarge):
        await store.put("big/x", Blob(text="x" * MAX_VALUE_BYTES))
    with pytest.raises(ValueTooLarge):
        await store.txn(
            [], [Put("big/y", Counter(n=1)), Put("big/x", Blob(text="x" * MAX_VALUE_BYTES))]
        )
    assert (await store.list("big/", Blob)).items == []


async def test_reading_a_value_as_the_wrong_model_is_a_typed_error(store: Store) -> None:
    await store.put("a/x", Blob(text="hello"))
    with pytest.raises(CorruptValue):
        await store.get("a/x", Counter)


async def test_list_leaves_out_values_that_do_not_validate_and_names_them(store: Store) -> None:
    await store.put("mixed/a", Counter(n=1))
    await store.put("mixed/b", Blob(text="not a counter"))
    await store.put("mixed/c", Counter(n=3))
    listing = await store.list("mixed/", Counter)
    assert [item.value.n for item in listing.items] == [1, 3]
    assert listing.invalid == ["mixed/b"]
