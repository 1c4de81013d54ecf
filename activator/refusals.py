"""Why a request gets no lease, in words a person can act on: pure functions of the pool's
records and `now`, called by `Activator.acquire`, which raises what they return.

- A pool in a crash cooldown (a wall-clock time the pool controller wrote) is answered at
  once, with its last boot log, and told to come back when the cooldown ends.
- A stateful app whose state a node keeps (it could not hand it back) cannot start until an
  operator frees it: answered at once, rather than after the activation budget.
- A request that waited out its activation timeout is told which wait it was: every sandbox
  at its hard limit, a stateful app's one sandbox moving, or nothing becoming ready.
"""

from __future__ import annotations

from wakeful.domain.leases import AppFailedToBoot, NoCapacity
from wakeful.domain.models import AppSpec, AppState, Pool

RETRY_AFTER = 5
"""Seconds a request that waited out its activation timeout is told to wait."""
STATE_KEPT_RETRY_AFTER = 60
"""Seconds a request to an app whose state is kept is told to wait (an operator must act)."""


def crashing(pool: Pool, now: float) -> AppFailedToBoot | None:
    """The answer while the pool is in a crash cooldown; `now` on the wall clock."""
    if pool.crash_cooldown_until <= now:
        return None
    return AppFailedToBoot(
        f"app {pool.app!r} failed to boot ({pool.crash_count} crashes in a row)",
        retry_after=pool.crash_cooldown_until - now,
        log=pool.last_crash_log,
    )


def state_kept(app: str, state: AppState | None) -> NoCapacity | None:
    """The answer for a stateful app whose state a node kept; `state` is `states/{app}`."""
    if state is None or not state.kept:
        return None
    return NoCapacity(
        f"app {app!r} keeps state that node {state.node} could not hand "
        "back: it starts again once an operator frees it (`wakeful nodes` says "
        f"why; `wakeful release-state {app}`)",
        retry_after=STATE_KEPT_RETRY_AFTER,
    )


def timed_out(app: str, spec: AppSpec, *, routable: bool) -> NoCapacity:
    """The answer for a request that waited out `spec.activation_timeout`; `routable`: some
    sandbox of the pool is routable (so each was at its hard limit)."""
    if routable:
        return NoCapacity(
            f"every sandbox of app {app!r} stayed at its hard limit of "
            f"{spec.concurrency.hard_limit} requests for {spec.activation_timeout:g} s",
            retry_after=RETRY_AFTER,
        )
    if spec.state is not None:  # its one sandbox waits for its state to be handed over
        return NoCapacity(
            f"app {app!r} keeps state and was not ready within {spec.activation_timeout:g} "
            "s: its sandbox is moving to another node or waits for its state to be handed "
            "back (`wakeful nodes` shows moves in progress)",
            retry_after=RETRY_AFTER,
        )
    return NoCapacity(
        f"no sandbox of app {app!r} became ready within {spec.activation_timeout:g} s",
        retry_after=RETRY_AFTER,
    )
