"""Traffic split between an app's versions, and the rules of a progressive rollout (issue 39):
pure; the ingress's router, `deploy/traffic.py` and `deploy/ramp.py` apply them.

Rules:
- **A split** is weights over deployed versions, whole percents summing to 100 (`parse_split`:
  `v7=90 v8=10`, `latest` naming the newest). A version at 0 takes no share of the weighted
  traffic (it can still be reached through a tag).
- **An even spread** (`Spread`): smooth weighted round-robin, as nginx spreads over weighted
  upstreams. Each pick adds every version's weight to its running score, takes the highest
  (the first in the split's order on a tie) and takes the total from it. Counted from the
  spread's start, each version's count is within one of its exact share after every request
  (over any other stretch of requests, within two): 90/10 over 1,000 requests gives exactly
  100 to the 10% version, never a random walk.
- **A ramp** (`ramp_plan`) moves a new version to 100% in equal steps over its duration: from
  1% alone, or from the canary's share, in steps of at most `MAX_STEP` points.
- **A verdict** (`verdict`): over the same window, the new version is rolled back when its 5xx
  share exceeds the stable version's by more than `max_error_ratio`, or its p99 exceeds the
  stable's times `max_p99_ratio` and by more than `min_p99_increase`; never on fewer than
  `min_requests` of its own requests (one error in two requests is no evidence).
- **Tag names** (`tag_problem`): a DNS label without `--`, so `TAG--APP.<domain>` reads one
  way only (a new app's name has no `--` either; one from before keeps its own host first).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wakeful.domain.models import App

LATEST = "latest"
MAX_STEP = 25
"""The largest share a ramp moves at once, in points."""
_PERCENT = re.compile(r"[0-9]{1,3}")
"""ASCII digits only: `str.isdigit` takes `²` and other scripts' digits too."""
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class SplitError(ValueError):
    """A split that cannot be applied; the message names the argument and the value."""


def parse_split(
    arguments: Sequence[str], versions: Sequence[str], latest: str | None
) -> dict[str, int]:
    """`VERSION=PERCENT ...` as weights by version, in the order given. `versions`: those
    deployed; `latest`: the newest (what `latest` names)."""
    weights: dict[str, int] = {}
    for argument in arguments:
        name, equals, percent = argument.partition("=")
        if not equals or not name:
            raise SplitError(f"{argument!r}: give VERSION=PERCENT (v7=90)")
        if name == LATEST:
            if latest is None:
                raise SplitError(f"{argument!r}: the app has no version yet")
            name = latest
        if name not in versions:
            raise SplitError(f"{argument!r}: {name} is not a deployed version")
        if name in weights:
            raise SplitError(f"{argument!r}: {name} is given twice")
        if not _PERCENT.fullmatch(percent) or int(percent) > 100:
            raise SplitError(f"{argument!r}: the percent is a whole number from 0 to 100")
        weights[name] = int(percent)
    if not weights:
        raise SplitError("give at least one VERSION=PERCENT")
    total = sum(weights.values())
    if total != 100:
        raise SplitError(f"the percents add up to {total}, not 100")
    return weights


class Spread:
    """The even spread of one split on one ingress (smooth weighted round-robin).

    The smooth round-robin's picks repeat with a period of the weights' sum over their
    greatest common divisor (at most 100 picks), so the whole period is computed once
    (`sequence`) and a pick only steps through it: the request path pays an index, not a
    loop over the split's versions."""

    __slots__ = ("_next", "sequence", "weights")

    def __init__(self, weights: Mapping[str, int]) -> None:
        self.weights = dict(weights)
        shares = {version: weight for version, weight in weights.items() if weight > 0}
        if not shares:
            raise SplitError("no version has a share")
        divisor = math.gcd(*shares.values())
        shares = {version: weight // divisor for version, weight in shares.items()}
        total = sum(shares.values())
        scores = dict.fromkeys(shares, 0)
        sequence = []
        for _ in range(total):
            best: str | None = None
            for version, weight in shares.items():
                scores[version] += weight
                if best is None or scores[version] > scores[best]:
                    best = version
            assert best is not None
            scores[best] -= total
            sequence.append(best)
        self.sequence: tuple[str, ...] = tuple(sequence)
        """One period of picks, in order."""
        self._next = 0

    def pick(self) -> str:
        at = self._next
        self._next = at + 1 if at + 1 < len(self.sequence) else 0
        return self.sequence[at]


def ramp_plan(start: int, duration: float) -> list[tuple[float, int]]:
    """(seconds after the start, share in points) for each step of a ramp to 100: the first
    at 0 with `start` (1 alone, or the canary's share), then equal steps of at most
    `MAX_STEP` points, evenly over `duration`, the last at `duration` with 100."""
    if not 0 < start <= 100:
        raise SplitError(f"a ramp starts from 1 to 100 percent, not {start}")
    if duration <= 0:
        raise SplitError(f"a ramp lasts longer than 0 s, not {duration:g}")
    if start == 100:
        return [(0.0, 100)]
    steps = -(-(100 - start) // MAX_STEP)  # ceil
    plan = [(0.0, start)]
    for step in range(1, steps + 1):
        share = start + round((100 - start) * step / steps)
        plan.append((duration * step / steps, share))
    return plan


@dataclass(frozen=True)
class Window:
    """What one version answered over a window: requests, 5xx answers, p99 in seconds."""

    requests: int
    errors: int
    p99: float
    seconds: float = 60.0
    """How long the window was (its rate is `requests / seconds`)."""

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Thresholds:
    max_error_ratio: float = 0.05
    """How far the new version's 5xx share may exceed the stable version's (0.05: 5 points)."""
    max_p99_ratio: float = 2.0
    """How many times the stable version's p99 the new version's may reach."""
    min_requests: int = 50
    """Fewer requests of the new version than this in a window decide nothing."""
    min_p99_increase: float = 0.025
    """Seconds the new version's p99 must exceed the stable's by, besides the ratio: below
    it the two are alike (a new sandbox's first answers, buckets a few ms wide)."""


def verdict(stable: Window, new: Window, rules: Thresholds) -> str | None:
    """Why the new version is rolled back, or None to go on."""
    if new.requests < rules.min_requests:
        return None
    excess = new.error_ratio - stable.error_ratio
    if excess > rules.max_error_ratio:
        return (
            f"5xx on {new.error_ratio:.1%} of {new.requests} requests against "
            f"{stable.error_ratio:.1%} for the stable version (more than "
            f"{rules.max_error_ratio:.1%} above it)"
        )
    slower = new.p99 > stable.p99 * rules.max_p99_ratio
    if (
        stable.requests
        and stable.p99 > 0
        and slower
        and new.p99 - stable.p99 > rules.min_p99_increase
    ):
        return (
            f"p99 {new.p99 * 1000:.0f} ms against {stable.p99 * 1000:.0f} ms for the stable "
            f"version (more than {rules.max_p99_ratio:g}x)"
        )
    return None


def routed(app: App) -> set[str]:
    """The versions whose pools serve: the active one, every one the split names (at 0% too:
    its pool scales to zero like an idle app's) and every tagged one. A deploy, a traffic
    change or an untag retires the pool of a version that leaves this set, and no other."""
    found = set(app.split) | set(app.tags.values())
    if app.active_version is not None:
        found.add(app.active_version)
    return found


def with_split(app: App, weights: Mapping[str, int]) -> App:
    """The app once `weights` (already checked by `parse_split`) is its traffic.

    One version at 100 ends the split: it becomes the active version (the one before it the
    previous). Otherwise the active version stays while it keeps a share, and else becomes
    the version with the largest one (the first given on a tie): requests that name no
    version, and the stable side of a rollback, go to it."""
    whole = [version for version, share in weights.items() if share == 100]
    if whole:
        target = whole[0]
        if target == app.active_version:
            return app.model_copy(update={"split": {}})
        return app.model_copy(
            update={"split": {}, "active_version": target, "previous_version": app.active_version}
        )
    active = app.active_version
    if active is None or weights.get(active, 0) == 0:
        active = max(weights, key=lambda version: weights[version])
    return app.model_copy(update={"split": dict(weights), "active_version": active})


def newest_in_split(app: App) -> str | None:
    """What `wakeful promote` gives all traffic to: the split's newest version other than the
    active one that has a share (versions are numbered v1, v2, ...); with none, the newest at
    0% (a `--keep-split` deploy); None when there is no split."""
    others = [version for version in app.split if version != app.active_version]
    sharing = [version for version in others if app.split[version] > 0]
    chosen = sharing or others
    return max(chosen, key=_number) if chosen else None


def _number(version: str) -> tuple[int, str]:
    digits = version[1:] if version.startswith("v") else ""
    return (int(digits), version) if digits.isdigit() else (-1, version)


def tag_problem(tag: str) -> str | None:
    """Why `tag` cannot name a version's own host (`TAG--APP.<domain>`), or None."""
    if not _LABEL.fullmatch(tag):
        return "is not a DNS label (lowercase letters, digits and '-', at most 63)"
    if "--" in tag:
        return "holds '--', which separates a tag from its app in a host"
    return None
