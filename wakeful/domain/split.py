"""Traffic split between an app's versions, and the rules of a progressive rollout: pure, the
first step of issue 39 (nothing routes by them yet).

Rules:
- **A split** is weights over deployed versions, whole percents summing to 100 (`parse_split`:
  `v7=90 v8=10`, `latest` naming the newest). A version at 0 takes no share of the weighted
  traffic (it can still be reached through a tag).
- **An even spread** (`Spread`): smooth weighted round-robin, as nginx spreads over weighted
  upstreams. Each pick adds every version's weight to its running score, takes the highest
  (the first in the split's order on a tie) and takes the total from it. Over any run of
  requests each version's count is within one of its exact share: 90/10 over 1,000 requests
  gives exactly 100 to the 10% version, never a random walk.
- **A ramp** (`ramp_plan`) moves a new version to 100% in equal steps over its duration: from
  1% alone, or from the canary's share, in steps of at most `MAX_STEP` points.
- **A verdict** (`verdict`): over the same window, the new version is rolled back when its 5xx
  share exceeds the stable version's by more than `max_error_ratio`, or its p99 exceeds the
  stable's times `max_p99_ratio`; never on fewer than `min_requests` of its own requests (one
  error in two requests is no evidence).
- **Tag names** (`tag_problem`): a DNS label without `--`, so `TAG--APP.<domain>` reads one
  way only (an app name has no `--` either).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

LATEST = "latest"
MAX_STEP = 25
"""The largest share a ramp moves at once, in points."""
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
        if not equals:
            raise SplitError(f"{argument!r}: give VERSION=PERCENT (v7=90)")
        if name == LATEST:
            if latest is None:
                raise SplitError(f"{argument!r}: the app has no version yet")
            name = latest
        if name not in versions:
            raise SplitError(f"{argument!r}: {name} is not a deployed version")
        if name in weights:
            raise SplitError(f"{argument!r}: {name} is given twice")
        if not percent.isdigit() or int(percent) > 100:
            raise SplitError(f"{argument!r}: the percent is a whole number from 0 to 100")
        weights[name] = int(percent)
    if not weights:
        raise SplitError("give at least one VERSION=PERCENT")
    total = sum(weights.values())
    if total != 100:
        raise SplitError(f"the percents add up to {total}, not 100")
    return weights


@dataclass
class Spread:
    """The even spread of one split on one ingress (smooth weighted round-robin)."""

    weights: Mapping[str, int]
    _scores: dict[str, int] = field(default_factory=dict)

    def pick(self) -> str:
        total = 0
        best: str | None = None
        for version, weight in self.weights.items():
            if weight <= 0:
                continue
            score = self._scores.get(version, 0) + weight
            self._scores[version] = score
            total += weight
            if best is None or score > self._scores[best]:
                best = version
        if best is None:
            raise SplitError("no version has a share")
        self._scores[best] -= total
        return best


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
    if stable.requests and stable.p99 > 0 and new.p99 > stable.p99 * rules.max_p99_ratio:
        return (
            f"p99 {new.p99 * 1000:.0f} ms against {stable.p99 * 1000:.0f} ms for the stable "
            f"version (more than {rules.max_p99_ratio:g}x)"
        )
    return None


def tag_problem(tag: str) -> str | None:
    """Why `tag` cannot name a version's own host (`TAG--APP.<domain>`), or None."""
    if not _LABEL.fullmatch(tag):
        return "is not a DNS label (lowercase letters, digits and '-', at most 63)"
    if "--" in tag:
        return "holds '--', which separates a tag from its app in a host"
    return None
