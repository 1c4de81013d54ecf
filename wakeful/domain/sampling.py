"""Which access lines an ingress keeps: the sampling rule of `wakeful.domain.logfiles`.

A module of its own because it runs for every request an ingress answers: it is compiled with
the exchange (`wakeful.native`), and the rest of the log directory's rules need not be.
"""

from __future__ import annotations

import math


class Sampler:
    """Which access lines an ingress keeps (see the module's rules). Time is passed in: `window`
    is the number of the current window (the caller's clock over its length)."""

    __slots__ = ("_every", "_kept", "_rate", "_seen", "_window", "dropped")

    def __init__(self, rate: int) -> None:
        if rate < 1:
            raise ValueError(f"rate: must be at least 1 (got {rate})")
        self._rate = rate
        self._window = -1
        self._seen = 0
        self._kept = 0
        self._every = 1
        self.dropped = 0
        """Lines not kept past the hard cap (twice the rate in a window)."""

    def keep(self, window: int) -> int:
        """0 to leave this line out, else the number of requests it stands for."""
        if window != self._window:
            if window == self._window + 1:  # the next window: size k from this one's load
                self._every = max(1, math.ceil(self._seen / self._rate))
            else:
                self._every = 1  # a quiet spell between: start again
            self._window = window
            self._seen = self._kept = 0
        self._seen += 1
        if self._seen <= self._rate and self._every == 1:
            self._kept += 1
            return 1
        every = max(self._every, 2)
        if self._seen % every:
            return 0
        if self._kept >= 2 * self._rate:
            self.dropped += 1
            return 0
        self._kept += 1
        return every
