"""Table tests of the suspended tier's pure rules (`activator/suspend_decisions.py`, invariant
24): which sandbox is suspended and why the others are not, and which a node's memory cap
stops."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from wakeful.activator.suspend_decisions import (
    Evict,
    EvictionTurn,
    Idleness,
    Listed,
    PoolSize,
    PoolVerdict,
    SuspendPool,
    SuspendVerdict,
    TurnOver,
    Why,
    eviction,
    plan_evictions,
    suspends,
)

T0 = 1_000.0
DELAY = 30.0
MiB = 1 << 20


def idle(**changes: Any) -> Idleness:
    """sb-1: routable, leaseless, created and first seen at T0, no traffic since."""
    found = Idleness(
        "sb-1",
        in_admission=True,
        leased=0,
        last_activity=0.0,
        created_at=T0,
        touched=0.0,
        seen_since=T0,
    )
    return found._replace(**changes)


def auto(*sandboxes: Idleness, **changes: Any) -> SuspendPool:
    """Pool p, auto, with a 30 s suspend_delay, routed to, without waiters."""
    found = SuspendPool(
        "p",
        suspend_delay=DELAY,
        mode="auto",
        retired=False,
        routed=True,
        waiters=0,
        sandboxes=sandboxes or (idle(),),
    )
    return found._replace(**changes)


def kept(why: Why) -> PoolVerdict:
    """Pool p keeps every sandbox, for `why`: none is looked at, nothing seen changes."""
    return PoolVerdict("p", why)


def looked_at(*verdicts: SuspendVerdict) -> PoolVerdict:
    return PoolVerdict("p", None, verdicts)


@pytest.mark.parametrize(
    ("pool", "knows", "now", "expected"),
    [
        pytest.param(
            auto(),
            True,
            T0 + 30,
            looked_at(SuspendVerdict("sb-1", Why.IDLE, T0)),
            id="idle for its delay",
        ),
        pytest.param(
            auto(),
            True,
            T0 + 29.9,
            looked_at(SuspendVerdict("sb-1", Why.RECENT, T0)),
            id="not before the delay: 29.9 s of 30",
        ),
        pytest.param(
            auto(idle(leased=1)),
            True,
            T0 + 86_400,
            looked_at(SuspendVerdict("sb-1", Why.LEASED, T0)),
            id="never one holding a lease, however long idle",
        ),
        pytest.param(
            auto(),
            False,
            T0 + 86_400,
            kept(Why.LEASES_UNKNOWN),
            id="not during a takeover's lease TTL: not every lease is known",
        ),
        pytest.param(
            auto(idle(seen_since=None)),
            False,
            T0 + 86_400,
            kept(Why.LEASES_UNKNOWN),
            id="while leases are unknown no sandbox is looked at, none seen routable yet",
        ),
        pytest.param(
            auto(idle(seen_since=None, created_at=0.0)),
            True,
            T0 + 86_400,
            looked_at(SuspendVerdict("sb-1", Why.RECENT, T0 + 86_400)),
            id="first seen routable now: idle from now, whatever its records say",
        ),
        pytest.param(
            auto(suspend_delay=0),
            True,
            T0 + 86_400,
            kept(Why.DELAY_OFF),
            id="suspend_delay 0 turns it off",
        ),
        pytest.param(
            auto(mode="fixed"),
            True,
            T0 + 86_400,
            kept(Why.FIXED),
            id="not a fixed pool: it keeps exactly its size running",
        ),
        pytest.param(
            auto(routed=False),
            True,
            T0 + 86_400,
            kept(Why.NOT_ROUTED),
            id="not a pool rolling out: its app routes to another",
        ),
        pytest.param(
            auto(retired=True),
            True,
            T0 + 86_400,
            kept(Why.RETIRED),
            id="not a retired pool",
        ),
        pytest.param(
            auto(waiters=1),
            True,
            T0 + 86_400,
            kept(Why.WAITERS),
            id="not while its pool has a waiter",
        ),
        pytest.param(
            auto(idle(in_admission=False)),
            True,
            T0 + 86_400,
            looked_at(SuspendVerdict("sb-1", Why.OUT_OF_ADMISSION, None)),
            id="not one out of admission, and when it was first seen is forgotten",
        ),
        pytest.param(
            auto(idle(created_at=T0 + 20)),
            True,
            T0 + 40,
            looked_at(SuspendVerdict("sb-1", Why.RECENT, T0)),
            id="a boot does not count: idle from its creation",
        ),
        pytest.param(
            auto(idle(last_activity=T0 + 20)),
            True,
            T0 + 40,
            looked_at(SuspendVerdict("sb-1", Why.RECENT, T0)),
            id="traffic written to last_activity counts",
        ),
        pytest.param(
            auto(idle(touched=T0 + 20)),
            True,
            T0 + 40,
            looked_at(SuspendVerdict("sb-1", Why.RECENT, T0)),
            id="an unwritten touch counts: a lease released or a thaw just now",
        ),
        pytest.param(
            auto(idle(touched=T0 + 20)),
            True,
            T0 + 50,
            looked_at(SuspendVerdict("sb-1", Why.IDLE, T0)),
            id="idle for its delay after the last touch",
        ),
    ],
)
def test_suspend(pool: SuspendPool, knows: bool, now: float, expected: PoolVerdict) -> None:
    assert suspends([pool], knows_every_lease=knows, now=now) == [expected]


def test_every_pool_gets_a_verdict_and_every_sandbox_looked_at_one_in_order() -> None:
    pools = [
        auto(idle(), idle(sandbox_id="sb-2", leased=2)),
        auto(idle(sandbox_id="sb-3"), waiters=4),
    ]
    verdicts = suspends(pools, knows_every_lease=True, now=T0 + 60)
    assert verdicts == [
        PoolVerdict(
            "p",
            None,
            (SuspendVerdict("sb-1", Why.IDLE, T0), SuspendVerdict("sb-2", Why.LEASED, T0)),
        ),
        PoolVerdict("p", Why.WAITERS),
    ]
    assert [v.suspend for v in verdicts[0].sandboxes] == [True, False]


# -- evict ---------------------------------------------------------------------------------


def frozen(sandbox_id: str, pool: str = "a", weight: int = MiB, **changes: Any) -> Listed:
    """A sandbox node n1 lists, still suspended there, neither thawing nor leased."""
    found = Listed(
        sandbox_id,
        weight=weight,
        pool=pool,
        on_node=True,
        suspended=True,
        thawing=False,
        leased=0,
    )
    return dataclasses.replace(found, **changes)


def size(desired: int = 3, **changes: Any) -> PoolSize:
    """A settled pool of `desired` live sandboxes, no minimum, none starting."""
    found = PoolSize(retired=False, desired=desired, min_instances=0, live=desired, starting=False)
    return dataclasses.replace(found, **changes)


@pytest.mark.parametrize(
    ("listed", "pool", "expected"),
    [
        pytest.param(frozen("sb-1"), size(), Evict.STOP, id="one that may go is stopped"),
        pytest.param(
            frozen("sb-1", suspended=False), size(), Evict.GONE, id="thawed or stopped: given"
        ),
        pytest.param(
            frozen("sb-1", on_node=False), size(), Evict.GONE, id="gone or elsewhere: given"
        ),
        pytest.param(
            frozen("sb-1"), size(retired=True), Evict.RETIRED, id="its pool retired: given"
        ),
        pytest.param(frozen("sb-1"), None, Evict.RETIRED, id="its pool gone: given"),
        pytest.param(frozen("sb-1", thawing=True), size(), Evict.THAWING, id="thawing: given"),
        pytest.param(
            frozen("sb-1", leased=1), size(), Evict.LEASED, id="leased: it thaws, so given"
        ),
        pytest.param(
            frozen("sb-1"),
            size(1, min_instances=1),
            Evict.PINNED,
            id="never below min_instances",
        ),
        pytest.param(
            frozen("sb-1"), size(3, live=2), Evict.RESIZING, id="a pool whose size is changing"
        ),
        pytest.param(
            frozen("sb-1"), size(starting=True), Evict.STARTING, id="a pool that is growing"
        ),
    ],
)
def test_eviction(listed: Listed, pool: PoolSize | None, expected: Evict) -> None:
    assert eviction(listed, pool) is expected


@pytest.mark.parametrize(
    ("asked", "listed", "pools", "stops"),
    [
        pytest.param(
            MiB,
            [frozen("sb-1"), frozen("sb-2")],
            {"a": size(2)},
            ["sb-1"],
            id="the longest suspended stops first, only as much as is over",
        ),
        pytest.param(
            2 * MiB + 1,
            [frozen("sb-1"), frozen("sb-2"), frozen("sb-3"), frozen("sb-4")],
            {"a": size(4)},
            ["sb-1", "sb-2", "sb-3"],
            id="until what they held adds up to what was asked",
        ),
        pytest.param(
            0,
            [frozen("sb-1")],
            {"a": size(1)},
            [],
            id="nothing asked, nothing stopped",
        ),
        pytest.param(
            MiB,
            [frozen("sb-1", weight=1 << 30), frozen("sb-2", "b"), frozen("sb-3", "b")],
            {"a": size(1, min_instances=1), "b": size(2)},
            ["sb-2"],
            id="a big pinned one at the head is passed over: the next goes, as much as asked",
        ),
        pytest.param(
            MiB,
            [frozen("sb-1", leased=1), frozen("sb-2"), frozen("sb-3")],
            {"a": size(3)},
            [],
            id="a leased one counts as given up and nothing stops in its place",
        ),
        pytest.param(
            MiB,
            [frozen("sb-1", thawing=True), frozen("sb-2")],
            {"a": size(2)},
            [],
            id="one being thawed counts as given up",
        ),
        pytest.param(
            MiB,
            [frozen("sb-1", "old"), frozen("sb-2")],
            {"old": size(1, retired=True), "a": size(1)},
            [],
            id="one of a retired pool counts as given up: it stops anyway",
        ),
        pytest.param(
            MiB,
            [frozen("sb-1", "b"), frozen("sb-2", suspended=False), frozen("sb-3")],
            {"a": size(1), "b": size(1)},
            [],
            id="a stale list stops nothing more, not even one passed over last time",
        ),
        pytest.param(
            MiB,
            [frozen("sb-1", "b"), frozen("sb-2"), frozen("sb-3")],
            {"a": size(2), "b": size(2, live=1, starting=True)},
            ["sb-2"],
            id="one passed over while its pool grows: the next listed goes",
        ),
        pytest.param(
            2 * MiB,
            [frozen("sb-1"), frozen("sb-2")],
            {"a": size(3)},
            ["sb-1", "sb-2"],
            id="two of one pool both go, the pool shrunk once for each",
        ),
        pytest.param(
            2 * MiB,
            [frozen("sb-1"), frozen("sb-2")],
            {"a": size(2, min_instances=1)},
            ["sb-1"],
            id="the second of a pool stays once the first took it to its minimum",
        ),
        pytest.param(
            10 * MiB,
            [frozen("sb-1"), frozen("sb-2", "b")],
            {"a": size(1), "b": size(1, min_instances=1)},
            ["sb-1"],
            id="asked more than all hold: every one that may go, and no more",
        ),
    ],
)
def test_plan_evictions(
    asked: int, listed: list[Listed], pools: dict[str, PoolSize], stops: list[str]
) -> None:
    assert plan_evictions(asked, listed, pools) == stops


def test_a_write_that_lost_a_race_ends_the_turn() -> None:
    turn = EvictionTurn.start(2 * MiB, [frozen("sb-1"), frozen("sb-2")], {"a": size(3)})
    head = turn.next()
    assert head is not None and head.sandbox_id == "sb-1"
    turn.raced()
    assert turn.next() is None
    with pytest.raises(TurnOver):
        turn.stopped()


def test_one_that_gave_up_meanwhile_counts_and_one_to_stop_is_never_just_passed() -> None:
    turn = EvictionTurn.start(MiB, [frozen("sb-1"), frozen("sb-2")], {"a": size(2)})
    with pytest.raises(TurnOver):
        turn.passed(Evict.STOP)
    assert turn.next() == frozen("sb-1")  # unchanged by the refused step
    turn.passed(Evict.THAWING)  # thawed while an earlier write was awaited
    assert turn.given == MiB and turn.next() is None
