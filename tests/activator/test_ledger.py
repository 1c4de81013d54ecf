"""The lease-and-waiter ledger on a clock the tests move: the lease table, TTLs and deadlines."""

from __future__ import annotations

import pytest

from wakeful.activator.decisions import Admit
from wakeful.activator.ledger import (
    TABLE,
    IllegalLeaseTransition,
    LeaseEvent,
    LeaseLedger,
    LeaseState,
    transition,
)
from wakeful.domain.leases import LeaseGone, Overloaded
from wakeful.testing import ManualClock

A, R, X, L = LeaseState.ACTIVE, LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.LOST
NORMAL = Admit("sb-1", "http://127.0.0.1:9000", 2, overflow=False)
OVERFLOW = Admit("sb-1", "http://127.0.0.1:9000", 1, overflow=True)


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        pytest.param(A, LeaseEvent.RENEW, A, id="a renewed lease stays active"),
        pytest.param(A, LeaseEvent.RELEASE, R, id="the holder hands it back"),
        pytest.param(A, LeaseEvent.EXPIRE, X, id="its TTL passes unrenewed"),
        pytest.param(A, LeaseEvent.LOSE, L, id="its sandbox goes away"),
    ],
)
def test_legal_transitions(state: LeaseState, event: LeaseEvent, expected: LeaseState) -> None:
    assert transition(state, event) is expected


@pytest.mark.parametrize(
    ("state", "event"),
    [
        pytest.param(R, LeaseEvent.RENEW, id="a released lease is not renewed"),
        pytest.param(X, LeaseEvent.RELEASE, id="an expired lease is not released twice"),
        pytest.param(L, LeaseEvent.EXPIRE, id="a lost lease does not expire too"),
        pytest.param(R, LeaseEvent.RELEASE, id="nor released twice"),
    ],
)
def test_illegal_transitions_raise(state: LeaseState, event: LeaseEvent) -> None:
    with pytest.raises(IllegalLeaseTransition, match=state.value):
        transition(state, event)


def test_an_ended_lease_has_no_way_out() -> None:
    assert not [key for key in TABLE if key[0] is not A]


def ledger(clock: ManualClock, max_waiters: int = 10) -> LeaseLedger:
    return LeaseLedger(lease_ttl=60, max_waiters=max_waiters, clock=clock)


def test_an_illegal_move_changes_nothing() -> None:
    book = ledger(ManualClock())
    lease = book.grant("web-v1", "web", NORMAL, None)
    assert book.release(lease.lease_id) is lease
    assert lease.state is R
    with pytest.raises(IllegalLeaseTransition):
        book._end(lease, LeaseEvent.EXPIRE)
    assert lease.state is R
    assert (book.leased_on("sb-1"), book.counts("web-v1")) == (0, (0, 0, 0))
    assert book.release(lease.lease_id) is None  # a second release is a no-op


def test_leases_count_capacity_by_sandbox_and_kind_by_pool() -> None:
    book = ledger(ManualClock())
    first = book.grant("web-v1", "web", NORMAL, None)
    book.grant("web-v1", "web", OVERFLOW, None)
    assert book.leased_on("sb-1") == 3
    assert book.counts("web-v1") == (1, 1, 0)
    assert [lease.state for lease in book.lose_leases_on("sb-1")] == [L, L]
    assert book.leased_on("sb-1") == 0
    assert book.counts("web-v1") == (0, 0, 0)
    with pytest.raises(LeaseGone):
        book.renew(first.lease_id)


def test_a_lease_past_its_ttl_cannot_be_renewed_before_it_is_swept() -> None:
    clock = ManualClock()
    book = ledger(clock)
    lease = book.grant("web-v1", "web", NORMAL, None)
    clock.advance(59)
    book.renew(lease.lease_id)
    clock.advance(60)
    with pytest.raises(LeaseGone):
        book.renew(lease.lease_id)
    assert book.leased_on("sb-1") == 2  # still counted until `expire` drops it
    assert book.expire() == [lease]
    assert (lease.state, book.leased_on("sb-1")) == (X, 0)


@pytest.mark.anyio
async def test_waiter_deadlines_run_on_the_same_clock_as_lease_ttls() -> None:
    clock = ManualClock()
    book = ledger(clock)
    lease = book.grant("web-v1", "web", NORMAL, None)
    waiter = book.park("web-v1", "web", deadline=clock() + 30)
    clock.advance(29.9)
    assert book.expire() == []
    assert not waiter.wake.is_set()
    clock.advance(0.1)
    assert book.expire() == []  # the lease has 30 s left
    assert waiter.wake.is_set()  # the waiter's deadline passed: it wakes to give up
    clock.advance(30)
    assert book.expire() == [lease]


@pytest.mark.anyio
async def test_a_granted_waiter_leaves_the_queue_in_the_same_step() -> None:
    book = ledger(ManualClock())
    waiter = book.park("web-v1", "web", deadline=1e9)
    assert book.counts("web-v1") == (0, 0, 1)
    book.grant("web-v1", "web", NORMAL, waiter)
    assert book.counts("web-v1") == (1, 0, 0)
    assert not book.unpark(waiter)  # already gone: the request's cleanup finds nothing


@pytest.mark.anyio
async def test_the_queue_is_bounded_and_a_release_wakes_it() -> None:
    book = ledger(ManualClock(), max_waiters=2)
    lease = book.grant("web-v1", "web", NORMAL, None)
    parked = [book.park("web-v1", "web", deadline=1e9) for _ in range(2)]
    with pytest.raises(Overloaded):
        book.park("web-v1", "web", deadline=1e9)
    book.release(lease.lease_id)
    assert all(waiter.wake.is_set() for waiter in parked)


@pytest.mark.anyio
async def test_a_forgotten_pool_is_dropped_once_nothing_is_left_in_it() -> None:
    book = ledger(ManualClock())
    lease = book.grant("web-v1", "web", NORMAL, None)
    waiter = book.park("web-v1", "web", deadline=1e9)
    book.forget_pool("web-v1")
    assert waiter.wake.is_set()
    book.move(waiter, "web-v2")
    assert book.counts("web-v2") == (0, 0, 1)
    assert book.counts("web-v1") == (1, 0, 0)
    book.release(lease.lease_id)
    assert "web-v1" not in book._pools
