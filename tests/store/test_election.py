"""Leader election and fenced writes (`wakeful.store.election`), on every backend."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from tests.support.store import hold_write_lock, pass_time
from wakeful.domain.models import Leader
from wakeful.store import Conflict, Deposed, Put, Require, Store
from wakeful.store.base import StoreBase
from wakeful.store.election import Election, FencedStore, Term
from wakeful.store.local import LocalStore
from wakeful.store.sqlite import SqliteEngine
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


def candidate(store: Store, name: str, **kwargs: float) -> Election:
    assert isinstance(store, StoreBase)
    return Election(
        store, "leaders/activator", Leader(holder=name, url=f"http://{name}"), ttl=2, **kwargs
    )


async def test_one_candidate_holds_the_role_and_the_next_takes_over_when_it_resigns(
    store: Store,
) -> None:
    a, b = candidate(store, "a", retry=0.05), candidate(store, "b", retry=0.05)
    first = await a.campaign()
    assert (await b.current()) == a.leader
    elected = []
    async with anyio.create_task_group() as tasks:

        async def run_b() -> None:
            elected.append(await b.campaign())

        tasks.start_soon(run_b)
        await anyio.sleep(0.3)
        assert not elected  # the role is held: b waits
        await a.resign(first)
        with anyio.fail_after(10):
            while not elected:  # noqa: ASYNC110
                await anyio.sleep(0.02)
    assert elected[0].revision > first.revision
    assert (await a.current()) == b.leader


async def test_a_deposed_holders_writes_are_refused_and_write_nothing(
    store: Store, ttl_clock: ManualClock | None
) -> None:
    assert isinstance(store, StoreBase)
    a, b = candidate(store, "a"), candidate(store, "b")
    term = await a.campaign()
    fenced = FencedStore(store, term)
    at = await fenced.create("pools/p", Counter(n=1))
    at = await fenced.update("pools/p", Counter(n=2), expect_revision=at)
    with pytest.raises(Conflict) as stale:  # a plain conflict stays a conflict
        await fenced.update("pools/p", Counter(n=3), expect_revision=at - 1)
    assert not isinstance(stale.value, Deposed)

    await pass_time(store, ttl_clock, 3)  # a's lease expires unrenewed (a stalled holder)
    await b.campaign()
    writes = [
        fenced.put("pools/p", Counter(n=9)),
        fenced.update("pools/p", Counter(n=9), expect_revision=at),
        fenced.create("pools/q", Counter(n=9)),
        fenced.delete("pools/p"),
        fenced.txn([Require("pools/p", at)], [Put("pools/p", Counter(n=9))]),
    ]
    for write in writes:
        with pytest.raises(Deposed):
            await write
    item = await store.get("pools/p", Counter)
    assert item is not None and (item.value.n, item.revision) == (2, at)
    assert await store.get("pools/q", Counter) is None


async def test_the_holder_learns_its_term_is_over_when_its_lease_goes(store: Store) -> None:
    a = candidate(store, "a")
    term = await a.campaign()

    async def expire() -> None:
        await anyio.sleep(0.1)
        await store.revoke(term.lease)  # as when the store expires it

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(expire)
        with pytest.raises(Deposed, match="expired"), anyio.fail_after(10):
            await a.hold(term)


async def test_a_holder_cut_off_from_the_store_gives_up_within_half_its_ttl(
    tmp_path: Path,
) -> None:
    """The store would expire the key a full TTL after the last renewal it saw; the holder
    stops at half of it, so two holders never act at once."""
    path = tmp_path / "store.db"
    clock = ManualClock()  # the holder's and the store's: a TTL passes only when moved
    store = LocalStore(SqliteEngine(path, busy_timeout=0.05), threaded=True, clock=clock)
    try:
        a = Election(store, "leaders/activator", Leader(holder="a"), ttl=2, clock=clock)
        term = await a.campaign()
        holder = hold_write_lock(path)  # renewals now fail (Unavailable)
        ended: list[BaseException] = []

        async def hold() -> None:
            try:
                await a.hold(term)
            except Deposed as exc:
                ended.append(exc)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(hold)
                await anyio.sleep(1)  # renewals fail, but not for half the TTL yet
                clock.advance(0.9)
                await anyio.sleep(1)
                assert not ended
                clock.advance(0.2)  # past half the TTL since the last renewal
                with anyio.fail_after(10):
                    while not ended:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
            assert "no renewal" in str(ended[0])
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        # The store is back and nobody was elected meanwhile: the same term is taken up again
        # at once (its key and lease are still there), without waiting for them to expire.
        with anyio.fail_after(5):
            assert await a.campaign(previous=term) == term
    finally:
        await store.aclose()


async def test_a_term_whose_lease_went_is_not_taken_up_again(store: Store) -> None:
    a = candidate(store, "a", retry=0.05)
    term = await a.campaign()
    await store.revoke(term.lease)
    with anyio.fail_after(10):
        again = await a.campaign(previous=term)
    assert again != term and again.revision > term.revision


# -- lead(work): the one leadership loop ------------------------------------------------------


class Work:
    """What a candidate does while it leads: records each term it ran with, and how its run
    ended. `stopping` seconds of shutdown, not cut short, after it is cancelled."""

    def __init__(self, stopping: float = 0.0) -> None:
        self.terms: list[Term] = []
        self.ended: list[str] = []
        self.started = anyio.Event()
        self.stopping = stopping

    async def __call__(self, term: Term) -> None:
        self.terms.append(term)
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.ended.append("cancelled")
            with anyio.CancelScope(shield=True):
                await anyio.sleep(self.stopping)

    async def next_term(self) -> Term:
        self.started = anyio.Event()
        with anyio.fail_after(10):
            await self.started.wait()
        return self.terms[-1]


async def test_lead_runs_the_work_with_its_term_and_one_told_to_stop_hands_over_at_once(
    store: Store,
) -> None:
    """The leader resigns as soon as it is told to stop, while its work still shuts down (a
    control plane's graceful shutdown takes seconds): the next candidate leads meanwhile."""
    a, b = candidate(store, "a", retry=0.05), candidate(store, "b", retry=0.05)
    work_a, work_b = Work(stopping=2.0), Work()
    async with anyio.create_task_group() as tasks:
        leading_a = anyio.CancelScope()
        stopped_a: list[bool] = []

        async def run_a() -> None:
            with leading_a:
                await a.lead(work_a)
            stopped_a.append(True)

        tasks.start_soon(run_a)
        term_a = await work_a.next_term()
        assert a.leading() and (await a.current()) == a.leader
        tasks.start_soon(b.lead, work_b)
        await anyio.sleep(0.3)
        assert not work_b.terms  # a leads: b waits

        leading_a.cancel()
        term_b = await work_b.next_term()
        assert work_a.ended == ["cancelled"] and not stopped_a  # still shutting down
        assert term_b.revision > term_a.revision and not a.leading()
        assert (await b.current()) == b.leader
        tasks.cancel_scope.cancel()


async def test_a_deposed_leader_stops_its_work_and_campaigns_again(store: Store) -> None:
    a = candidate(store, "a", retry=0.05)
    work = Work()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(a.lead, work)
        first = await work.next_term()
        await store.revoke(first.lease)  # as when the store expires it
        second = await work.next_term()
        assert work.ended == ["cancelled"]
        assert second.revision > first.revision  # a new term, not the lost one
        tasks.cancel_scope.cancel()
    assert (await a.current()) is None  # resigned when told to stop


async def test_a_work_that_returns_is_led_again_in_the_same_term(store: Store) -> None:
    """The activator's control plane that the store failed as it started: it stands by again
    and, nobody else being elected, takes its term up again at once."""
    a = candidate(store, "a", retry=0.05)
    terms: list[Term] = []
    again = anyio.Event()

    async def work(term: Term) -> None:
        terms.append(term)
        if len(terms) == 2:
            again.set()
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(a.lead, work)
        with anyio.fail_after(10):
            await again.wait()
        assert terms[0] == terms[1]
        tasks.cancel_scope.cancel()


async def test_an_error_of_the_work_resigns_the_term_and_is_raised(store: Store) -> None:
    a = candidate(store, "a", retry=0.05)

    async def work(term: Term) -> None:
        raise RuntimeError("the schema is newer than this wakeful")

    with pytest.raises(BaseExceptionGroup) as raised, anyio.fail_after(10):
        await a.lead(work)
    assert raised.group_contains(RuntimeError, match="schema is newer")
    assert (await a.current()) is None and not a.leading()


async def test_lead_campaigns_through_the_given_campaign(store: Store) -> None:
    """The activator serves its standby page while it campaigns."""
    a = candidate(store, "a", retry=0.05)
    asked: list[Term | None] = []
    work = Work()

    async def campaign(previous: Term | None) -> Term:
        asked.append(previous)
        return await a.campaign(previous)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(partial(a.lead, work, campaign=campaign))
        first = await work.next_term()
        await store.revoke(first.lease)
        await work.next_term()
        assert asked == [None, first]
        tasks.cancel_scope.cancel()
