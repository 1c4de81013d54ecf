"""The activator's decisions: pure functions of (pool state, observations, now).

No I/O, no clock reads, no awaits: the shells (`activator.core`, `activator.scale_up`,
`activator.ledger`) gather the inputs, call these, and carry out what they return. Seed 000
is the specification:

- Admission: a request waits only when no routable sandbox of its pool is below its hard limit
  (`concurrency.hard_limit`; without one, only when nothing is routable). When every routable
  sandbox is at its `requests_per_instance` target, the request still goes to the least-loaded
  one below the hard limit, on an *overflow* lease of size 1, and a scale-up is started: the
  target is a scaling target, the hard limit the only admission cap. A normal lease never
  takes a sandbox past its hard limit either.
- Scale-up is sized from demand, in one step:
  ceil((capacity leased on running sandboxes + one slot per waiter + one lease of headroom)
  / requests_per_instance), never below the current desired, never above max_instances.
- A pool is *short* (`wakeful.domain.leases.short`) for a while after a request of it got an
  overflow lease or waited at the hard limit, and while requests of it wait: renewals then
  ask holders for the normal leases they do not use.
- The scale-up gate returns before any arithmetic when a scale-up is in flight, when the pool
  is at its cap with no re-read due, or during the backoff after a failure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Mode = Literal["auto", "fixed"]

REREAD_INTERVAL = 30.0
"""At most this often, a pool whose cache claims more sandboxes than are live is re-read."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A routable sandbox and the capacity currently leased on it."""

    sandbox_id: str
    url: str
    leased: int


@dataclass(frozen=True, slots=True)
class Admit:
    sandbox_id: str
    url: str
    size: int
    overflow: bool


@dataclass(frozen=True, slots=True)
class Park:
    """Nothing routable: wait for a sandbox (and start a scale-up)."""


def lease_size(mode: Mode, requests_per_instance: int) -> int:
    """A normal lease's size: a batch of slots in auto mode, one slot in fixed mode."""
    if mode == "fixed":
        return 1
    return max(1, requests_per_instance // 5)


def admit(
    candidates: Sequence[Candidate],
    mode: Mode,
    requests_per_instance: int,
    hard_limit: int | None = None,
) -> Admit | Park:
    """Where one request runs. Ties go to the first candidate, so callers pass a stable order."""
    if hard_limit is not None:
        candidates = [c for c in candidates if c.leased < hard_limit]
    if not candidates:
        return Park()
    least = min(candidates, key=lambda c: c.leased)
    if mode == "fixed":
        return Admit(least.sandbox_id, least.url, 1, overflow=False)
    size = lease_size(mode, requests_per_instance)
    with_room = [c for c in candidates if c.leased + size <= requests_per_instance]
    if with_room:
        chosen = min(with_room, key=lambda c: c.leased)
        return Admit(chosen.sandbox_id, chosen.url, size, overflow=False)
    return Admit(least.sandbox_id, least.url, 1, overflow=True)


def demanded_instances(
    *,
    leased: int,
    waiters: int,
    lease_size: int,
    requests_per_instance: int,
    desired: int,
    max_instances: int,
) -> int:
    """The pool size the demand needs, in one step."""
    need = math.ceil((leased + waiters + lease_size) / requests_per_instance)
    if waiters > 0:
        need = max(need, 1)
    return min(max(need, desired), max_instances)


def to_thaw(
    *,
    leased: int,
    waiters: int,
    lease_size: int,
    requests_per_instance: int,
    routable: int,
    thawing: int,
    suspended: int,
) -> int:
    """How many suspended sandboxes to thaw for the demand (the suspended tier's fast path):
    what the demand needs in sandboxes, as a scale-up sizes it, beyond those routable and those
    thawing already, at most the suspended ones there are. A waiter means nothing routable had
    room for it, so one more than the routable ones is needed, unless a thaw (with room) is
    on its way already."""
    need = math.ceil((leased + waiters + lease_size) / requests_per_instance)
    if waiters > 0 and thawing == 0:
        need = max(need, routable + 1)
    return max(0, min(suspended, need - routable - thawing))


class Gate(StrEnum):
    IN_FLIGHT = "in_flight"
    BACKOFF = "backoff"
    CAPPED = "capped"
    PROCEED = "proceed"


def scale_up_gate(
    *,
    in_flight: bool,
    now: float,
    backoff_until: float,
    desired: int,
    max_instances: int,
    reread_due: bool,
) -> Gate:
    """Whether to start a scale-up at all; cheap enough to call on every saturated request."""
    if in_flight:
        return Gate.IN_FLIGHT
    if now < backoff_until:
        return Gate.BACKOFF
    if desired >= max_instances and not reread_due:
        return Gate.CAPPED
    return Gate.PROCEED


def reread_due(*, desired: int, live: int, now: float, last_reread: float) -> bool:
    """The cache claims more sandboxes than are live, and the last re-read is old enough."""
    return live < desired and now - last_reread >= REREAD_INTERVAL


class Step(StrEnum):
    WRITE = "write"
    REREAD = "reread"
    COVERED = "covered"


@dataclass(frozen=True, slots=True)
class ScalePlan:
    step: Step
    target: int


def plan_scale_up(
    *,
    leased: int,
    waiters: int,
    lease_size: int,
    requests_per_instance: int,
    desired: int,
    max_instances: int,
    live: int,
    now: float,
    last_reread: float,
) -> ScalePlan:
    """Write a bigger desired; or, when demand looks covered but fewer sandboxes are live than
    the cache claims, re-read the pool (a missed scale-down must not block scaling for good)."""
    target = demanded_instances(
        leased=leased,
        waiters=waiters,
        lease_size=lease_size,
        requests_per_instance=requests_per_instance,
        desired=desired,
        max_instances=max_instances,
    )
    if target > desired:
        return ScalePlan(Step.WRITE, target)
    if reread_due(desired=desired, live=live, now=now, last_reread=last_reread):
        return ScalePlan(Step.REREAD, target)
    return ScalePlan(Step.COVERED, target)


def expired(deadlines: dict[str, float], now: float) -> list[str]:
    """The lease ids whose deadline has passed."""
    return [lease_id for lease_id, deadline in deadlines.items() if deadline <= now]
