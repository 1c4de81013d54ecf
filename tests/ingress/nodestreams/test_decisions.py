"""Table tests of relay-or-wait (`ingress/nodestreams/decisions.py`): where a request for a
tunnelled node's sandbox looks for a stream next, and what it does once every place said no."""

from __future__ import annotations

import pytest

from wakeful.ingress.nodestreams.decisions import (
    RELAY_AFTER,
    GiveUp,
    Relay,
    Seen,
    Stage,
    Step,
    TakeHere,
    Why,
    next_step,
)

FIRST, ASK, WAIT = Stage.FIRST, Stage.ASK_IDLE_PEERS, Stage.WAIT


@pytest.mark.parametrize(
    ("stage", "seen", "expected"),
    [
        pytest.param(
            FIRST,
            Seen(here=2, idle_here=1, peers=[("r2", 1)], left=30),
            TakeHere(wait=0.0, then=ASK),
            id="an idle stream here: take it, though a peer has one too",
        ),
        pytest.param(
            FIRST,
            Seen(here=2, peers=[("r2", 1)], left=30),
            TakeHere(wait=RELAY_AFTER, then=ASK),
            id="every stream here busy: wait 50 ms for one before asking a peer",
        ),
        pytest.param(
            FIRST,
            Seen(peers=[("r2", 1)], left=30),
            Relay(("r2",), patient=False, then=WAIT),
            id="no stream here, a peer holds an idle one: relay, answered at once",
        ),
        pytest.param(
            FIRST,
            Seen(peers=[("r3", 3), ("r2", 1), ("r4", 0)], left=30),
            Relay(("r3", "r2"), patient=False, then=WAIT),
            id="no stream here, two peers idle and one busy: ask the idle ones, most idle first",
        ),
        pytest.param(
            FIRST,
            Seen(peers=[("r2", 0), ("r3", 0)], left=30),
            Relay(("r2", "r3"), patient=True, then=Stage.BUSY_PEERS),
            id="no stream here, peers hold only busy ones: relay and wait there",
        ),
        pytest.param(
            FIRST,
            Seen(left=30),
            GiveUp(Why.UNREACHABLE),
            id="no stream on any replica: unreachable at once",
        ),
        pytest.param(
            ASK,
            Seen(here=2, peers=[("r2", 1)], left=29.9),
            Relay(("r2",), patient=False, then=WAIT),
            id="busy here past 50 ms, a peer holds an idle one: relay, answered at once",
        ),
        pytest.param(
            ASK,
            Seen(here=2, peers=[("r2", 0)], left=29.9),
            TakeHere(wait=29.9, then=Stage.BUSY_HERE),
            id="busy here past 50 ms, no peer idle: wait here for the time left",
        ),
        pytest.param(
            ASK,
            Seen(here=2, peers=[("r2", -1)], left=29.9),
            TakeHere(wait=29.9, then=Stage.BUSY_HERE),
            id="a record counting more busy streams than streams shows none idle",
        ),
        pytest.param(
            WAIT,
            Seen(here=1, peers=[("r2", 1)], left=29.8),
            TakeHere(wait=29.8, then=Stage.BUSY_HERE),
            id="the idle peers said no, the node holds streams here: wait here, not there",
        ),
        pytest.param(
            WAIT,
            Seen(peers=[("r2", 1), ("r3", 0)], left=29.8),
            Relay(("r2", "r3"), patient=True, then=Stage.BUSY_PEERS),
            id="the idle peers said no, no stream here: relay to all holding any, waiting there",
        ),
        pytest.param(
            WAIT,
            Seen(left=29.8),
            GiveUp(Why.UNREACHABLE),
            id="the node's streams were gone everywhere by the time the peers said no",
        ),
        pytest.param(
            ASK,
            Seen(here=1, peers=[("r2", 1)], left=30, can_relay=False),
            TakeHere(wait=30, then=Stage.BUSY_HERE),
            id="no ingress token, a peer holds an idle one: never relayed, wait here",
        ),
        pytest.param(
            FIRST,
            Seen(peers=[("r2", 1)], left=30, can_relay=False),
            GiveUp(Why.BUSY_PEERS),
            id="no ingress token, no stream here, a peer holds some: busy, not unreachable",
        ),
        pytest.param(
            Stage.BUSY_HERE,
            Seen(here=2, idle_here=1, peers=[("r2", 1)]),
            GiveUp(Why.BUSY_HERE),
            id="the wait here ran out: 503, whatever freed since",
        ),
        pytest.param(
            Stage.BUSY_PEERS,
            Seen(peers=[("r2", 1)]),
            GiveUp(Why.BUSY_PEERS),
            id="every peer's wait ran out: 503",
        ),
    ],
)
def test_next_step(stage: Stage, seen: Seen[str], expected: Step[str]) -> None:
    assert next_step(stage, seen) == expected


SEEN = [
    Seen(here=here, idle_here=idle, peers=peers, left=1, can_relay=relay)
    for here, idle in ((0, 0), (2, 0), (2, 1))
    for peers in ([], [("r2", 0)], [("r2", 1), ("r3", 0)])
    for relay in (True, False)
]


@pytest.mark.parametrize("seen", SEEN)
def test_a_request_that_finds_no_stream_anywhere_gives_up_within_four_steps(
    seen: Seen[str],
) -> None:
    """Every step failing, each place is asked once and the search ends: no stage comes back."""
    visited: list[Stage] = []
    step = next_step(Stage.FIRST, seen)
    while not isinstance(step, GiveUp):
        assert step.then not in visited
        visited.append(step.then)
        step = next_step(step.then, seen)
    assert len(visited) <= 3
