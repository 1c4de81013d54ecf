"""How long to wait after failures in a row: one policy for every retry loop in wakeful.

`Backoff` is pure and reads no clock: a loop counts its failures in a row (`Retries`) and asks
for the pause after the latest; the shell sleeps it (`wakeful.aio.backoff.retry`, or the
loop's own `anyio.sleep`) or turns it into a deadline on its own clock. The rule: the first
failure waits `first`; each failure after it `factor` times longer than the one before; no
pause is longer than `cap`. A success starts the count again. Nothing is random: every
caller's numbers are those of the loop it replaced, none of which had jitter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    first: float
    """Seconds after the first failure."""
    cap: float = math.inf
    """No pause is longer."""
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.cap:
            raise ValueError(f"a backoff needs 0 <= first <= cap, got {self.first}, {self.cap}")
        if self.factor < 1:
            raise ValueError(f"a backoff's factor must be at least 1, got {self.factor}")

    def delay(self, failures: int) -> float:
        """The pause after `failures` failures in a row (1: the first); 0 before any."""
        if failures < 1 or self.first == 0:
            return 0.0
        try:
            grown = self.first * self.factor ** (failures - 1)
        except OverflowError:  # past any cap long before
            return self.cap
        return min(grown, self.cap)


@dataclass(slots=True)
class Retries:
    """Failures in a row under one policy: the state a retry loop keeps between attempts."""

    policy: Backoff
    failures: int = 0

    def failed(self) -> float:
        """One more failure: the pause before the next attempt."""
        self.failures += 1
        return self.policy.delay(self.failures)

    def succeeded(self) -> None:
        self.failures = 0
