"""The per-request tracker that keeps an app's load gauges honest (seed 001).

`requests_in_flight` counts only requests being proxied to a sandbox (holding capacity); a
request waiting for capacity is in `requests_queued` instead. Each request owns a `Tracker`
whose phase changes follow one table; repeating a move is a no-op, so a retry that holds
capacity again never counts the request twice. `ingress.metrics` shows the counts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Phase(StrEnum):
    NEW = "new"
    QUEUED = "queued"
    PROXYING = "proxying"
    DONE = "done"


class Move(StrEnum):
    WAIT = "wait"
    """Waiting for the activator to grant capacity."""
    HOLD = "hold"
    """Holds capacity: about to be, or being, proxied."""
    FINISH = "finish"


# Members as module constants, `Final` (C statics, compiled): every request makes a `Tracker`
# and moves it twice; an enum member read through its class costs ~75 ns on Python 3.11.
NEW: Final = Phase.NEW
QUEUED: Final = Phase.QUEUED
PROXYING: Final = Phase.PROXYING
DONE: Final = Phase.DONE
WAIT: Final = Move.WAIT
HOLD: Final = Move.HOLD
FINISH: Final = Move.FINISH


TRANSITIONS: Final[dict[tuple[Phase, Move], Phase]] = {
    (Phase.NEW, Move.WAIT): Phase.QUEUED,
    (Phase.NEW, Move.HOLD): Phase.PROXYING,
    (Phase.NEW, Move.FINISH): Phase.DONE,
    (Phase.QUEUED, Move.WAIT): Phase.QUEUED,
    (Phase.QUEUED, Move.HOLD): Phase.PROXYING,
    (Phase.QUEUED, Move.FINISH): Phase.DONE,
    (Phase.PROXYING, Move.WAIT): Phase.PROXYING,
    (Phase.PROXYING, Move.HOLD): Phase.PROXYING,
    (Phase.PROXYING, Move.FINISH): Phase.DONE,
    (Phase.DONE, Move.FINISH): Phase.DONE,
}
"""A retry asks for capacity again while it still holds the lease it failed on (kept until the
request ends, so the activator steers the retry elsewhere): it stays PROXYING, counted once.
Nothing moves out of DONE but FINISH."""


class IllegalMove(Exception):  # mypyc compiles no subclass of RuntimeError
    pass


def advance(phase: Phase, move: Move) -> Phase:
    try:
        return TRANSITIONS[(phase, move)]
    except KeyError:
        raise IllegalMove(f"a request in phase {phase} cannot {move}") from None


class Load:
    """An app's requests in each counted phase, as its gauges report them."""

    __slots__ = ("in_flight", "queued")

    def __init__(self) -> None:
        self.in_flight = 0
        self.queued = 0


class Tracker:
    """One request's place in the load gauges."""

    __slots__ = ("_load", "phase")

    def __init__(self, load: Load) -> None:
        self._load = load
        self.phase = NEW

    def hold(self) -> None:
        """`move(HOLD)`, which every proxied request makes, without the table's lookup (its
        half of the cost); `test_rules` checks it against `TRANSITIONS` from every phase."""
        before = self.phase
        if before is PROXYING:
            return
        if before is DONE:
            raise IllegalMove(f"a request in phase {before} cannot {HOLD}")
        if before is QUEUED:
            self._load.queued -= 1
        self._load.in_flight += 1
        self.phase = PROXYING

    def finish(self) -> None:
        """`move(FINISH)`, as `hold`: every phase may finish."""
        before = self.phase
        if before is PROXYING:
            self._load.in_flight -= 1
        elif before is QUEUED:
            self._load.queued -= 1
        self.phase = DONE

    def move(self, move: Move) -> None:
        before = self.phase
        after = TRANSITIONS.get((before, move)) or advance(before, move)  # raises if illegal
        if after is before:
            return
        load = self._load
        if before is QUEUED:
            load.queued -= 1
        elif before is PROXYING:
            load.in_flight -= 1
        if after is QUEUED:
            load.queued += 1
        elif after is PROXYING:
            load.in_flight += 1
        self.phase = after
