"""Per-app traffic as the ingresses report it, and the activator's 15-minute ring of it.

Every ingress sends, with its lease renewals (about every 2 s), what it answered per app since
its last report: requests, 5xx answers, and their durations counted in the fixed buckets of
`BOUNDS`. Counts in fixed buckets add up across ingresses, so the activator can tell p50 and
p99 of all of them without any ingress keeping a sample. The activator keeps them in a
`TrafficRing` of `SLOTS` slots of `STEP` seconds per app (15 minutes), with the most waiters
it saw in each slot: the dashboard's charts, with no Prometheus needed. Memory is bounded: a
ring per app the activator knows, each of `SLOTS` slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from wakeful.domain.models import NAME_PATTERN

BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Upper bounds (seconds) of the duration buckets; one more bucket counts everything above."""
BUCKETS = len(BOUNDS) + 1
STEP = 10.0
"""Seconds per slot of the ring."""
SLOTS = 90
"""Slots kept: 15 minutes."""
MAX_APPS_PER_REPORT = 500
"""Apps in one report operation (the ingress splits a larger report)."""


class Counted(BaseModel):
    """Answers counted in one report (or one slot): of an app, or of one of its versions."""

    model_config = ConfigDict(extra="forbid")

    requests: int = Field(ge=0, le=1 << 40)
    errors: int = Field(default=0, ge=0, le=1 << 40)
    """Of which 5xx."""
    buckets: list[Annotated[int, Field(ge=0, le=1 << 40)]] = Field(
        min_length=BUCKETS, max_length=BUCKETS
    )


MAX_VERSIONS_PER_REPORT = 64
"""Versions of one app in one report (a split names at most 16, tags at most 32)."""


class AppTraffic(Counted):
    """One app's answers in one report, and the same per version the requests named (the
    activator keeps those of apps with a split or tags: issue 39)."""

    versions: dict[Annotated[str, StringConstraints(pattern=NAME_PATTERN)], Counted] = Field(
        default_factory=dict, max_length=MAX_VERSIONS_PER_REPORT
    )


TrafficReport = dict[Annotated[str, StringConstraints(pattern=NAME_PATTERN)], AppTraffic]
"""What one ingress answered per app since its last report."""


def quantile(buckets: list[int], q: float) -> float | None:
    """The `q` quantile (seconds) of durations counted in `buckets`, interpolated linearly
    within the bucket it falls in (as Prometheus's `histogram_quantile`); the top bound when
    it falls above every bound; None with no counts."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(buckets):
        if count and seen + count >= rank:
            if index == len(BOUNDS):
                return float(BOUNDS[-1])
            low = 0.0 if index == 0 else BOUNDS[index - 1]
            return low + (BOUNDS[index] - low) * max(0.0, rank - seen) / count
        seen += count
    return float(BOUNDS[-1])


@dataclass(slots=True)
class _Slot:
    start: float
    requests: int = 0
    errors: int = 0
    buckets: list[int] | None = None
    """None until traffic comes: an app with waiters only costs no bucket list."""
    waiters: int = 0
    shown: tuple[float, float | None, float | None] | None = None
    """Its rate, p50 and p99 once it is over: a closed slot never changes, so a dashboard
    that asks every second computes each slot's quantiles once."""


class TrafficRing:
    """Per app, the last `SLOTS` slots of `STEP` seconds (wall clock) of reported traffic and
    sampled waiters. One writer (the activator's event loop)."""

    def __init__(self, step: float = STEP, slots: int = SLOTS) -> None:
        self._step = step
        self._slots = slots
        self._apps: dict[str, dict[int, _Slot]] = {}

    def _slot(self, app: str, now: float) -> _Slot:
        index = math.floor(now / self._step)
        ring = self._apps.setdefault(app, {})
        slot = ring.get(index)
        if slot is None:
            slot = ring[index] = _Slot(start=index * self._step)
            for old in [i for i in ring if i <= index - self._slots]:
                del ring[old]
        return slot

    def add(self, app: str, traffic: Counted, now: float) -> None:
        slot = self._slot(app, now)
        slot.requests += traffic.requests
        slot.errors += traffic.errors
        if slot.buckets is None:
            slot.buckets = list(traffic.buckets)
        else:
            for index, count in enumerate(traffic.buckets):
                slot.buckets[index] += count

    def waiters(self, app: str, waiting: int, now: float) -> None:
        """A sample of the app's waiters: its slot keeps the most it saw. None waiting costs
        nothing (a slot with no sample reads 0): 10,000 idle apps hold no slots."""
        if waiting > 0:
            slot = self._slot(app, now)
            slot.waiters = max(slot.waiters, waiting)

    def requests(self, app: str) -> int:
        """Requests the ring holds for `app` (its last 15 minutes)."""
        return sum(slot.requests for slot in self._apps.get(app, {}).values())

    def window_start(self, now: float, seconds: float) -> float:
        """When the slots `window` adds up begin."""
        return math.floor((now - seconds) / self._step) * self._step

    def keep(self, apps: set[str]) -> None:
        """Forget apps not in `apps` (deleted), and versions (`app/version` keys) not in it
        either: the ring stays as large as the apps and their routed versions are many."""
        for app in [a for a in self._apps if a not in apps]:
            del self._apps[app]

    def window(self, key: str, now: float, seconds: float) -> tuple[int, int, list[int]]:
        """Requests, 5xx answers and duration buckets of `key` over the slots that end
        after `now - seconds` (whole slots: up to one slot more than `seconds`, from
        `window_start`)."""
        first = math.floor((now - seconds) / self._step)
        requests = errors = 0
        buckets = [0] * BUCKETS
        for index, slot in self._apps.get(key, {}).items():
            if index >= first:
                requests += slot.requests
                errors += slot.errors
                if slot.buckets is not None:
                    for at, count in enumerate(slot.buckets):
                        buckets[at] += count
        return requests, errors, buckets

    def series(self, app: str, now: float) -> dict[str, Any]:
        """The app's last `SLOTS` slots, oldest first, ending with the one `now` is in:
        requests per second, p50 and p99 in ms (None where a slot had no answers), and the
        most waiters (0 where none was seen)."""
        last = math.floor(now / self._step)
        ring = self._apps.get(app, {})
        rate: list[float | None] = []
        p50: list[float | None] = []
        p99: list[float | None] = []
        waiting: list[int] = []
        for index in range(last - self._slots + 1, last + 1):
            slot = ring.get(index)
            if slot is None:
                rate.append(None)
                p50.append(None)
                p99.append(None)
                waiting.append(0)
                continue
            shown = slot.shown
            if shown is None:
                # The slot under way is divided by the part of it that has passed.
                span = self._step if index < last else max(1.0, now - slot.start)
                shown = (
                    round(slot.requests / span, 3),
                    None if slot.buckets is None else _ms(quantile(slot.buckets, 0.5)),
                    None if slot.buckets is None else _ms(quantile(slot.buckets, 0.99)),
                )
                if index < last:
                    slot.shown = shown
            rate.append(shown[0])
            p50.append(shown[1])
            p99.append(shown[2])
            waiting.append(slot.waiters)
        return {
            "step": self._step,
            "end": (last + 1) * self._step,
            "requests_per_s": rate,
            "p50_ms": p50,
            "p99_ms": p99,
            "waiters": waiting,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
