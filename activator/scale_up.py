"""Growing a pool to the size its demand needs, by compare-and-set on `desired_instances`.

Theory of operation (invariants 3 to 5): `start` runs on every park and every overflow
admission, so it asks the cheap gate first (`decisions.scale_up_gate`). At most one scale-up
per pool runs at a time, in the activator's task group. It plans from the cached pool record
(`decisions.plan_scale_up`, the sizing math) and writes only against that record's revision.
On a conflict it re-reads and decides again from the fresh record, up to `ROUNDS` times, so a
concurrent writer's change is never undone. After a failure, or rounds that do not settle, the
pool backs off for `backoff` seconds on the activator's clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio.abc

from wakeful.activator import decisions
from wakeful.activator.ledger import LeaseLedger
from wakeful.activator.metrics import ActivatorMetrics
from wakeful.activator.view import PoolState, View
from wakeful.aio import trace
from wakeful.domain.models import ScaleChange
from wakeful.store import Conflict, Item, Store, StoreError

log = logging.getLogger(__name__)

ROUNDS = 10
"""Conflicts in a row after which a scale-up gives up and backs off."""


@dataclass(slots=True, eq=False)
class ScaleState:
    in_flight: bool = False
    backoff_until: float = 0.0
    last_reread: float = -math.inf


class ScaleUpRunner:
    def __init__(
        self,
        store: Store,
        view: View,
        ledger: LeaseLedger,
        metrics: ActivatorMetrics,
        *,
        backoff: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._view = view
        self._ledger = ledger
        self._metrics = metrics
        self._backoff = backoff
        self._clock = clock
        self._wall_clock = wall_clock
        self._by_pool: dict[str, ScaleState] = {}
        self.tasks: anyio.abc.TaskGroup | None = None
        """Where scale-ups run; None while the activator is not running (then none starts)."""

    def forget(self, pool: str) -> None:
        """The pool left the view; a scale-up in flight keeps its own state to the end."""
        self._by_pool.pop(pool, None)

    def start(self, state: PoolState) -> None:
        """Start a scale-up of the pool unless the gate says not to."""
        scale = self._by_pool.get(state.name)
        if scale is None:
            scale = self._by_pool[state.name] = ScaleState()
        if scale.in_flight:
            return
        pool = state.item.value
        if pool.spec.concurrency.mode == "fixed" or self.tasks is None:
            return
        now = self._clock()
        gate = decisions.scale_up_gate(
            in_flight=scale.in_flight,
            now=now,
            backoff_until=scale.backoff_until,
            desired=pool.desired_instances,
            max_instances=pool.max_instances,
            reread_due=decisions.reread_due(
                desired=pool.desired_instances,
                live=self._view.live(state),
                now=now,
                last_reread=scale.last_reread,
            ),
        )
        if gate is not decisions.Gate.PROCEED:
            if gate is not decisions.Gate.IN_FLIGHT:
                self._metrics.scale_ups.labels(pool=pool.name, result=gate.value).inc()
            return
        scale.in_flight = True
        self.tasks.start_soon(self._run, state, scale)

    async def _run(self, state: PoolState, scale: ScaleState) -> None:
        try:
            for _ in range(ROUNDS):
                item = state.item
                pool = item.value
                now = self._clock()
                leased = self._view.leased_on_running(
                    state, self._ledger.leased_capacity_by_sandbox
                )
                waiters = self._ledger.waiting(state.name)
                plan = decisions.plan_scale_up(
                    leased=leased,
                    waiters=waiters,
                    lease_size=decisions.lease_size("auto", pool.requests_per_instance),
                    requests_per_instance=pool.requests_per_instance,
                    desired=pool.desired_instances,
                    max_instances=pool.max_instances,
                    live=self._view.live(state),
                    now=now,
                    last_reread=scale.last_reread,
                )
                if plan.step is decisions.Step.COVERED:
                    return
                if plan.step is decisions.Step.REREAD:
                    scale.last_reread = now
                    if not await self._view.reread(state):
                        return
                    continue
                change = ScaleChange(
                    at=self._wall_clock(),
                    by="demand",
                    from_instances=pool.desired_instances,
                    to_instances=plan.target,
                    reason=(
                        f"demand: {leased} leased + {waiters} waiting at "
                        f"{pool.requests_per_instance} per sandbox"
                    ),
                )
                grown = pool.model_copy(
                    update={"desired_instances": plan.target, "last_scale": change}
                )
                try:
                    revision = await self._store.update(
                        item.key, grown, expect_revision=item.revision
                    )
                except Conflict:
                    self._metrics.scale_ups.labels(pool=pool.name, result="conflict").inc()
                    if not await self._view.reread(state):
                        return
                    continue
                self._metrics.scale_ups.labels(pool=pool.name, result="applied").inc()
                trace.mark("scale_up", pool.app)
                log.info(
                    "scaled up %s from %d to %d",
                    pool.name,
                    pool.desired_instances,
                    plan.target,
                    extra={"pool": pool.name},
                )
                self._view.apply_pool(Item(item.key, grown, revision))
            scale.backoff_until = self._clock() + self._backoff
        except StoreError as exc:
            log.warning("scale-up of %s failed: %s", state.name, exc, extra={"pool": state.name})
            self._metrics.scale_ups.labels(pool=state.name, result="failed").inc()
            scale.backoff_until = self._clock() + self._backoff
        finally:
            scale.in_flight = False
