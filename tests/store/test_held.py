"""A record held under a TTL lease (`wakeful.store.held`), on every backend: written under a
lease, kept past its TTL while its holder runs, written again when the lease is lost, gone at
once when released."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from tests.support.store import hold_write_lock, pass_time
from wakeful.store import CorruptValue, Store, StoreError
from wakeful.store.held import Found, HeldRecord, Over, Taken, found, over
from wakeful.store.local import LocalStore
from wakeful.store.sqlite import SqliteEngine
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio

TTL = 2
"""The shortest an election allows; renewed every 0.67 s."""


class Replica(BaseModel):
    name: str
    relay: str


async def value_of(store: Store) -> str | None:
    item = await store.get("ingresses/r1", Replica)
    return None if item is None else item.value.relay


def held(store: Store, **kwargs: Callable[[], Awaitable[None]]) -> HeldRecord[Replica]:
    return HeldRecord(
        store, "ingresses/r1", Replica(name="r1", relay="a:1"), ttl=TTL, what="r1", **kwargs
    )


async def test_the_record_is_written_under_a_lease_and_released_at_once(store: Store) -> None:
    record = held(store)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(record.run)
        with anyio.fail_after(10):
            await record.held.wait()
        assert await value_of(store) == "a:1"
        tasks.cancel_scope.cancel()
    assert await value_of(store) == "a:1"  # stopping alone leaves it to its TTL
    await record.release(within=5)
    assert await value_of(store) is None and record.lease is None
    await record.release(within=5)  # twice: nothing to do


async def test_the_record_outlives_its_ttl_while_its_holder_runs(
    store: Store, ttl_clock: ManualClock | None
) -> None:
    record = held(store)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(record.run)
        with anyio.fail_after(10):
            await record.held.wait()
        for _ in range(3):  # 4.5 s of TTL time, renewed in between
            await pass_time(store, ttl_clock, 1.5)
            await anyio.sleep(0.8)  # a renewal (every TTL / 3)
        assert await value_of(store) == "a:1"
        tasks.cancel_scope.cancel()
    await record.release(within=5)


async def test_a_lost_lease_is_replaced_and_the_record_written_again(store: Store) -> None:
    writes = 0

    async def after_write() -> None:
        nonlocal writes
        writes += 1

    record = held(store, after_write=after_write)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(record.run)
        with anyio.fail_after(10):
            await record.held.wait()
        first = record.lease
        assert first is not None and writes == 1
        await store.revoke(first)  # as when the store expires it: the record goes with it
        assert await value_of(store) is None
        with anyio.fail_after(10):  # the write is seen before `after_write` has run: both
            while await value_of(store) != "a:1" or writes < 2:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert record.lease != first and writes == 2
        tasks.cancel_scope.cancel()
    await record.release(within=5)


async def test_put_writes_at_once_while_held_and_is_what_the_next_lease_gets(
    store: Store,
) -> None:
    record = held(store)
    await record.put(Replica(name="r1", relay="b:2"))  # not held yet: only remembered
    assert await value_of(store) is None
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(record.run)
        with anyio.fail_after(10):
            await record.held.wait()
        assert await value_of(store) == "b:2"
        await record.put(Replica(name="r1", relay="c:3"))
        assert await value_of(store) == "c:3"
        lease = record.lease
        assert lease is not None
        await store.revoke(lease)
        with anyio.fail_after(10):
            while await value_of(store) != "c:3":  # noqa: ASYNC110
                await anyio.sleep(0.05)
        tasks.cancel_scope.cancel()
    await record.release(within=5)
    await record.put(Replica(name="r1", relay="d:4"))  # released: not written
    assert await value_of(store) is None


async def test_a_record_another_holder_of_its_key_took_away_is_written_again(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Two processes of one name hold one key: the later write wins, under the later lease,
    and the earlier holder leaves it to it (no flapping between the two). When the later one
    stops (its lease revoked, its record with it), the earlier one, still running, writes its
    own again at its next renewal: before, its record stayed gone for as long as it ran."""
    first = held(store)
    second = HeldRecord(store, "ingresses/r1", Replica(name="r1", relay="b:2"), ttl=TTL, what="r1")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first.run)
        with anyio.fail_after(10):
            await first.held.wait()
        stop_second = anyio.CancelScope()

        async def run_second() -> None:
            with stop_second:
                await second.run()

        tasks.start_soon(run_second)
        with anyio.fail_after(10):
            await second.held.wait()
        assert await value_of(store) == "b:2"
        with anyio.fail_after(10):  # the first one notices at a renewal, and says so once
            while "another process wrote its record" not in caplog.text:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        await anyio.sleep(1.5)  # two more renewals of each: the second's stays
        assert await value_of(store) == "b:2"
        assert caplog.text.count("another process wrote its record") == 1
        stop_second.cancel()  # the second process stops, as a holder does: then releases
        await second.release(within=5)
        with anyio.fail_after(10):
            while await value_of(store) != "a:1":  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert "its record was gone though its lease lives" in caplog.text
        tasks.cancel_scope.cancel()
    await first.release(within=5)
    assert await value_of(store) is None


class Older(BaseModel):
    """Another version's record of the same key: this version cannot read it."""

    name: str


async def test_a_record_of_another_holder_it_cannot_read_is_left_alone(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Two of one name on two versions: the one that cannot read the other's record takes it
    for someone else's, as it is, rather than for a store failure (which wrote over it under a
    new lease, and the two overwrote each other for as long as both ran)."""
    first = held(store)
    second = HeldRecord(store, "ingresses/r1", Older(name="r1"), ttl=TTL, what="older")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first.run)
        with anyio.fail_after(10):
            await first.held.wait()
        tasks.start_soon(second.run)
        with anyio.fail_after(10):
            await second.held.wait()
            while "another process wrote its record" not in caplog.text:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        await anyio.sleep(1.5)  # two more renewals of each
        with pytest.raises(CorruptValue):  # still the older one's: not written over
            await store.get("ingresses/r1", Replica)
        assert "cannot keep its record" not in caplog.text
        tasks.cancel_scope.cancel()
    await second.release(within=5)
    await first.release(within=5)


async def test_a_change_whose_write_failed_is_written_at_the_next_renewal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`put` failed (another process held the file's write lock): the store still has the
    holder's previous value. The next renewal's read finds its own older write and writes the
    new value, rather than taking it for another process's record and leaving it stale."""
    path = tmp_path / "store.db"
    store = LocalStore(SqliteEngine(path, busy_timeout=0.05), threaded=True)
    try:
        record = held(store)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(record.run)
            with anyio.fail_after(10):
                await record.held.wait()
            holder = hold_write_lock(path)
            with pytest.raises(StoreError):
                await record.put(Replica(name="r1", relay="b:2"))
            holder.execute("ROLLBACK")
            holder.close()
            assert await value_of(store) == "a:1"  # the failed write left the old value
            with anyio.fail_after(10):
                while await value_of(store) != "b:2":  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert "another process wrote its record" not in caplog.text
            tasks.cancel_scope.cancel()
        await record.release(within=5)
    finally:
        await store.aclose()


def alone(store: Store, relay: str) -> HeldRecord[Replica]:
    """A holder that must be alone under its key; its own records are those with its relay."""
    return HeldRecord(
        store,
        "ingresses/r1",
        Replica(name="r1", relay=relay),
        ttl=TTL,
        what=relay,
        claimable=lambda found: found.relay == relay,
    )


async def test_a_holder_alone_under_its_key_writes_over_no_one_elses_record(
    store: Store,
) -> None:
    """Another's record, or one it cannot read: `run` ends with `Taken`, nothing written. Its
    own previous run's: written over."""
    other = alone(store, "b:2")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(other.run)
        with anyio.fail_after(10):
            await other.held.wait()
        mine = alone(store, "a:1")
        with anyio.fail_after(10), pytest.raises(Taken) as raised:
            await mine.run()
        assert raised.value.holder == Replica(name="r1", relay="b:2")
        assert await value_of(store) == "b:2" and not mine.held.is_set()
        tasks.cancel_scope.cancel()
    await other.release(within=5)
    await mine.release(within=5)  # its lease, granted: revoked, nothing of the other's goes

    await store.put("ingresses/r1", Older(name="r1"))
    with anyio.fail_after(10), pytest.raises(Taken) as raised:
        await alone(store, "a:1").run()
    assert raised.value.holder is None

    await store.put("ingresses/r1", Replica(name="r1", relay="a:1"))  # a previous run's
    again = alone(store, "a:1")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(again.run)
        with anyio.fail_after(10):
            await again.held.wait()
        tasks.cancel_scope.cancel()
    await again.release(within=5)
    assert await value_of(store) is None  # written under its lease: gone with it


async def test_two_holders_alone_that_start_together_do_not_both_get_through(
    store: Store,
) -> None:
    """Both may find the key empty: one writes, the other's write finds it written (a
    conflict), looks again and finds the first's record."""
    holders = [alone(store, "a:1"), alone(store, "b:2")]
    taken: list[HeldRecord[Replica]] = []

    async def hold(holder: HeldRecord[Replica]) -> None:
        try:
            await holder.run()
        except Taken:
            taken.append(holder)

    async with anyio.create_task_group() as tasks:
        for holder in holders:
            tasks.start_soon(hold, holder)
        with anyio.fail_after(10):
            while not (taken and any(h.held.is_set() for h in holders)):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        (winner,) = (h for h in holders if h.held.is_set())
        assert taken == [h for h in holders if h is not winner]
        assert await value_of(store) == winner.value.relay
        tasks.cancel_scope.cancel()
    for holder in holders:
        await holder.release(within=5)


A, B, C = (Replica(name="r1", relay=relay) for relay in ("a:1", "b:2", "c:3"))


@pytest.mark.parametrize(
    ("record", "value", "stored", "step"),
    [
        (A, A, A, Found.OURS),
        (A, A, None, Found.OURS),  # the same value, a twin's: as good
        (None, A, A, Found.REWRITE),  # gone while the lease lives
        (None, A, None, Found.REWRITE),
        (B, A, B, Found.REWRITE),  # its own, from before a change whose write failed
        (C, A, B, Found.THEIRS),
        (B, A, None, Found.THEIRS),
    ],
)
def test_found(record: Replica | None, value: Replica, stored: Replica | None, step: Found) -> None:
    assert found(record, value, stored) is step


@pytest.mark.parametrize(
    ("record", "stored", "step"),
    [
        (None, None, Over.CREATE),
        (None, A, Over.CREATE),
        (A, None, Over.UPDATE),  # claimable: its own previous run's
        (B, B, Over.UPDATE),  # its own last write
        (B, None, Over.TAKEN),
        (B, C, Over.TAKEN),
    ],
)
def test_over(record: Replica | None, stored: Replica | None, step: Over) -> None:
    assert over(record, stored, lambda found: found.relay == "a:1") is step
