"""`Deadline`: one timer per connection, moved for the price of a float, never late."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import cast

import pytest

from wakeful.aio.deadline import Deadline


class _Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """The two things `Deadline` asks of a loop, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed = 0
        self._timers: list[tuple[float, int, _Handle, Callable[[], None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Handle:
        self.armed += 1
        handle = _Handle()
        heapq.heappush(self._timers, (when, next(self._order), handle, callback))
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock on, running each timer at its own time."""
        until = self.now + seconds
        while self._timers and self._timers[0][0] <= until:
            when, _, handle, callback = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not handle.cancelled:
                callback()
        self.now = until


def _deadline() -> tuple[_Loop, Deadline, list[float]]:
    loop = _Loop()
    fired: list[float] = []
    deadline = Deadline(cast(asyncio.AbstractEventLoop, loop), lambda: fired.append(loop.now))
    return loop, deadline, fired


def test_moving_it_later_arms_no_new_timer_and_it_fires_at_the_new_time() -> None:
    loop, deadline, fired = _deadline()
    deadline.after(5)
    for _ in range(1000):  # a busy connection: every request pushes it on
        loop.advance(0.001)
        deadline.after(5)
    assert loop.armed == 1
    loop.advance(4.9)
    assert fired == []
    loop.advance(0.2)
    assert fired == [pytest.approx(1.0 + 5)]
    assert loop.armed == 2  # the first timer fired early and re-armed once


def test_moving_it_earlier_fires_at_the_earlier_time() -> None:
    loop, deadline, fired = _deadline()
    deadline.after(10)
    deadline.after(1)
    loop.advance(1)
    assert fired == [pytest.approx(1.0)]
    loop.advance(20)
    assert len(fired) == 1  # once, not again at 10


def test_a_cleared_or_cancelled_deadline_never_fires() -> None:
    loop, deadline, fired = _deadline()
    deadline.after(1)
    deadline.clear()
    loop.advance(5)
    deadline.after(1)
    deadline.cancel()
    loop.advance(5)
    assert fired == []
    deadline.after(1)  # set again after a cancel: it works again
    loop.advance(1)
    assert fired == [pytest.approx(11.0)]
