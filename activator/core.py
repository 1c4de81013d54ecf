"""The activator: admission, leases, parked waiters and scale-up over a watched view.

A facade over five parts, each the one writer of its state:
- `view.View`: apps, pools and sandboxes, fed by the store watch (the only consumer of it);
- `ledger.LeaseLedger`: leases and parked waiters, synchronous, on one monotonic clock;
- `scale_up.ScaleUpRunner`: the compare-and-set growth of `desired_instances`;
- `activity.ActivityWriter`: `last_activity` writes, at most one per sandbox per interval;
- `suspend.Suspender`: the suspended tier (idle sandboxes frozen, thawed for demand before any
  scale-up, evicted for a node's memory cap).

Theory of operation:
- A request parks only when nothing in its pool is routable. A sandbox becoming routable, a
  release, a pool update and a resync wake every waiter of the pool; each re-runs admission
  (invariant 1), and a granted waiter leaves the queue in the step that records its lease
  (invariant 6): `_try_admit` reads the view and writes the ledger with no await between.
- `clock` (monotonic) times leases, waiter deadlines, scale-up backoff and activity intervals;
  `wall_clock` only stamps and reads what other processes share through the store
  (`last_activity`, `crash_cooldown_until`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from wakeful.activator import decisions, refusals
from wakeful.activator.activity import ActivityWriter
from wakeful.activator.ledger import Lease, LeaseLedger, Waiter
from wakeful.activator.metrics import ActivatorMetrics
from wakeful.activator.reporting import Charts, PoolSnapshot, WakeTally, pool_snapshots
from wakeful.activator.scale_up import ScaleUpRunner
from wakeful.activator.settings import ActivatorSettings
from wakeful.activator.spares import SpareAsks
from wakeful.activator.suspend import Suspender
from wakeful.activator.term import Term
from wakeful.activator.view import PoolState, View
from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain.leases import LeaseGone, LeaseGrant, Riders
from wakeful.domain.models import GONE, App, AppState, SandboxStatus
from wakeful.domain.split import Window
from wakeful.domain.traffic import TrafficReport
from wakeful.store import Store, StoreError

__all__ = ["Activator", "Lease", "PoolSnapshot", "WakeTally"]

log = logging.getLogger(__name__)


class Activator:
    def __init__(
        self,
        store: Store,
        settings: ActivatorSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """`leading`: whether this activator's election term is certainly still current;
        checked before every grant, adoption and renewal (a process paused past its term
        grants nothing when it wakes, before it has noticed)."""
        self._settings = settings
        self._store = store
        self._wall_clock = wall_clock
        self._metrics = ActivatorMetrics(registry)
        self._ledger = LeaseLedger(
            lease_ttl=settings.lease_ttl, max_waiters=settings.max_waiters, clock=clock
        )
        self._term = Term(lease_ttl=settings.lease_ttl, clock=self._ledger.clock, leading=leading)
        self._view = View(store, _Reactions(self))
        self.spare_asks = SpareAsks(self._view.pools)
        """Who hears at once that a pool turned short (the lease channels)."""
        self._ledger.became_short = self.spare_asks.tell
        self._scale_up = ScaleUpRunner(
            store,
            self._view,
            self._ledger,
            self._metrics,
            backoff=settings.scale_up_backoff,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._activity = ActivityWriter(
            store, self._view, interval=settings.activity_write_interval, clock=clock
        )
        self._suspender = Suspender(
            store,
            self._view,
            self._ledger,
            self._activity,
            self._metrics,
            clock=clock,
            wall_clock=wall_clock,
            changed=self._ledger.wake,
            allowed=self._term.may_suspend,
        )
        self.last_lease_gone: Callable[[], None] = lambda: None
        self.access_sink: Callable[[str, list[dict[str, object]]], None] | None = None
        """Where ingresses' access lines go (the control plane's log); None: nowhere."""
        """Called when the last lease on a sandbox out of admission (draining) is released:
        the pool controller (`Reconciler.nudge`) stops it then, not at its next tick (lease
        releases are not store changes it would see)."""
        self.deposed = self._term.deposed
        """Set when this activator stopped leading (`stop_granting`): it grants nothing more,
        and its lease channels close so their ingresses go to the new leader."""
        self._charts = Charts(self._view, self._ledger, wall_clock)
        self.traffic = self._charts.traffic
        """The last 15 minutes of each app's traffic, from the ingresses' reports
        (`record_traffic`) and this activator's waiters: the dashboard's charts."""

    @contextlib.asynccontextmanager
    async def running(
        self, *, watch: bool = True, adopt_for: float = 0.0, suspend: bool = True
    ) -> AsyncIterator[Activator]:
        """Run the activator's loops for the duration of the block.

        With `watch=False` the view is loaded once and then changes only through `resync()`
        and the activator's own writes: tests use it to hold the view stale on purpose.
        `adopt_for`: seconds after start during which nothing is granted, only leases other
        activators granted are adopted from their holders (a takeover: see `adopt`).
        `suspend=False`: idle sandboxes are suspended only by `suspend_idle` (tests that
        drive the wall clock by hand); thaws still run.
        """
        async with anyio.create_task_group() as tasks:
            self._term.took_over = adopt_for > 0
            if adopt_for == 0:
                self.open_admission()
            elif adopt_for != math.inf:  # inf: until `open_admission`
                tasks.start_soon(self.open_admission_after, adopt_for)
            self._scale_up.tasks = tasks
            self._suspender.tasks = tasks
            if watch:
                tasks.start_soon(self._view.follow)
            else:
                await self._view.resync()
            tasks.start_soon(self._expiry_loop)
            tasks.start_soon(self._activity.run)
            tasks.start_soon(self._charts.run)
            if suspend:
                tasks.start_soon(self._suspender.run)
            with anyio.fail_after(60):
                await self._view.synced.wait()
            try:
                yield self
            finally:
                tasks.cancel_scope.cancel()
                self._scale_up.tasks = None
                self._suspender.tasks = None

    async def open_admission_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        self.open_admission()

    def stop_granting(self) -> None:
        """This activator no longer leads: nothing more is granted or adopted, and every
        waiter gives up (`Unreachable`, which an ingress retries on the new leader)."""
        self.deposed.set()
        self._ledger.wake_all()

    def open_admission(self) -> None:
        """End the adoption window now (see `running`). After a takeover nothing is suspended
        for one lease TTL more: an ingress cut off for longer than the window reports its
        leases late, and a sandbox it still uses must not be frozen under its requests."""
        if self._term.open_admission() and self._term.took_over:
            log.info("admission open: %d leases adopted", len(self._ledger.leases_by_id))

    async def resync(self) -> None:
        """Re-list the view and wake every waiter."""
        await self._view.resync()

    # -- admission --------------------------------------------------------------------------

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> Lease:
        """A lease on a sandbox of the app's pool, waiting (bounded) only when none is routable.
        `riders`: the requests waiting on this ask (`Leases.acquire`); parked, it counts as
        that many in the pool's demand, followed as they join and leave (seed 000: a slot per
        waiting request, no more)."""
        if not self._view.synced.is_set():  # (a set event's wait still yields the loop once)
            await self._view.synced.wait()
        if not self._term.admitting.is_set():
            await self._term.admitting.wait()
        self._term.check()
        state = await self._view.settled(app, version)
        started = self._ledger.clock()
        deadline = started + state.item.value.spec.activation_timeout
        waiter: Waiter | None = None
        asleep = False
        try:
            while True:
                if not self._view.current(state):
                    # A deploy retired this pool (or it went away): follow the app's route to
                    # its new pool, taking this request's place in the queue along.
                    fresh = await self._view.settled(app, version)
                    if waiter is not None and fresh.name != waiter.pool:
                        moved_from = waiter.pool
                        self._ledger.move(waiter, fresh.name)
                        self._publish(moved_from)
                        self._publish(fresh.name)
                    state = fresh
                    if waiter is not None:  # its place moved: is it now waiting for a wake?
                        asleep = asleep or self._view.ready(state) == 0
                if waiter is not None:
                    waiter.wake = anyio.Event()
                self._term.check()
                lease = self._try_admit(state, waiter)
                if lease is not None:
                    waited = self._ledger.clock() - started
                    self._metrics.wait.observe(waited)
                    if waiter is not None:
                        trace.mark("lease", app)
                        if asleep:
                            lease.woke_after = waited
                            thawed = lease.sandbox_id in self._suspender.thawed
                            lease.woke_by = "thaw" if thawed else "start"
                            self._metrics.wake.labels(kind=lease.woke_by).observe(waited)
                            self._charts.woke(app, lease.woke_by, waited)
                    return lease
                crashing = refusals.crashing(state.item.value, self._wall_clock())
                if crashing is not None:  # a crash cooldown: at once, with the last boot log
                    raise crashing
                if waiter is None and state.item.value.spec.state is not None:
                    await self._fail_if_state_kept(app)
                if waiter is None:
                    asleep = self._view.ready(state) == 0  # this request waits for a wake
                    requests = 1 if riders is None else max(1, riders.count)
                    waiter = self._ledger.park(state.name, app, deadline, requests=requests)
                    if riders is not None:
                        riders.watch(functools.partial(self._regrow, waiter))
                    self._publish(state.name)
                    trace.mark("wait", app)
                self._suspender.wake(state)  # thaw before start: the fast path
                self._scale_up.start(state)
                remaining = waiter.deadline - self._ledger.clock()
                if remaining <= 0:
                    leased = self._ledger.leased_capacity_by_sandbox
                    routable = bool(self._view.candidates(state, leased))
                    raise refusals.timed_out(app, state.item.value.spec, routable=routable)
                with anyio.move_on_after(remaining):
                    await waiter.wake.wait()
        finally:
            if riders is not None:
                riders.watch(None)
            if waiter is not None and self._ledger.unpark(waiter):
                self._publish(waiter.pool)

    def _regrow(self, waiter: Waiter, by: int) -> None:
        """Requests joined (left) a parked ask: the demand follows, and may size its pool
        again (at most one scale-up runs at a time; it reads the demand when it decides)."""
        state = self._view.pools.get(waiter.pool)  # the pool it waits on now (moves follow)
        if self._ledger.grow(waiter, by) and by > 0 and state is not None:
            self._suspender.wake(state)
            self._scale_up.start(state)
        self._publish(waiter.pool)

    def wakes(self, app: str) -> WakeTally | None:
        """How the app's waiting requests woke it since this activator leads (None: never)."""
        return self._charts.wakes(app)

    def _try_admit(self, state: PoolState, waiter: Waiter | None) -> Lease | None:
        pool = state.item.value
        candidates = self._view.candidates(state, self._ledger.leased_capacity_by_sandbox)
        concurrency = pool.spec.concurrency
        decision = decisions.admit(
            candidates, concurrency.mode, pool.requests_per_instance, concurrency.hard_limit
        )
        if isinstance(decision, decisions.Park):
            if candidates:  # every routable sandbox at its hard limit: the pool is short
                self._ledger.short_of(pool.name)
            return None
        lease = self._ledger.grant(pool.name, pool.app, decision, waiter)
        lease.server_timing = pool.spec.server_timing
        lease.access_log = pool.spec.access_log
        lease.access_log_query = pool.spec.access_log_query
        lease.protocol = pool.spec.protocol
        lease.version = pool.version
        self._activity.touch(lease.sandbox_id, self._wall_clock())
        if decision.overflow:  # (the ledger marks the pool short: `LeaseLedger.grant`)
            self._metrics.overflow.labels(pool=pool.name).inc()
            self._suspender.wake(state)
            self._scale_up.start(state)
        self._publish(pool.name)
        return lease

    async def _fail_if_state_kept(self, app: str) -> None:
        """A stateful app whose state a node keeps (it could not hand it back) cannot start
        until an operator acts: answered at once, rather than after the activation budget.
        One store read, only for a stateful app with nothing routable."""
        found = None
        with anyio.move_on_after(0.5), contextlib.suppress(StoreError):  # never a long wait
            found = await self._store.get(keys.state(app), AppState)
        refused = refusals.state_kept(app, None if found is None else found.value)
        if refused is not None:
            raise refused

    # -- leases -----------------------------------------------------------------------------

    def renew(self, lease_id: str, *, used: bool = False) -> Lease:
        """Extend a lease's TTL; `used` says it carried traffic since the last renew."""
        self._term.check()
        lease = self._ledger.renew(lease_id)
        if used:
            self._activity.touch(lease.sandbox_id, self._wall_clock())
        if not self._view.routable(lease.sandbox_id):
            # Draining: the lease stays valid (renewed just now) for the requests already on
            # it, which finish and release it; the holder must not start new ones there.
            raise LeaseGone(f"lease {lease_id!r} is on a sandbox that is leaving admission")
        return lease

    def renew_grant(self, lease_id: str, *, used: bool = False) -> LeaseGrant:
        """`renew`, as its holder is told: `spare_wanted` while its pool is short."""
        lease = self.renew(lease_id, used=used)
        return lease.grant(spare_wanted=self._ledger.wants_spares(lease.pool))

    def adopt(self, app: str, grant: LeaseGrant) -> Lease:
        """Take over a lease another activator granted, reported by its holder after a
        takeover (invariant 20): its capacity stays counted, so none is granted twice. A lease
        on a sandbox this view does not have, or that is leaving, is `LeaseGone` (its holder
        drops it, as on a failed renewal)."""
        self._term.check()
        item = self._view.sandboxes.get(grant.sandbox_id)
        if item is None or item.value.status in GONE or item.value.app != app:
            raise LeaseGone(f"lease {grant.lease_id!r} is on no sandbox of {app!r} here")
        known = grant.lease_id in self._ledger.leases_by_id
        lease = self._ledger.adopt(item.value.pool, app, grant)
        if item.value.status is SandboxStatus.SUSPENDED:
            self._suspender.thaw(item)  # a frozen sandbox must not hold a lease: wake it
        if not known:
            self._metrics.adopted.inc()
            self._publish(lease.pool)
        return lease

    def release(self, lease_id: str) -> None:
        """Hand a lease back. Idempotent: a second release, or one after expiry, is a no-op."""
        lease = self._ledger.release(lease_id)
        if lease is not None:
            self._activity.touch(lease.sandbox_id, self._wall_clock())
            self._publish(lease.pool)
            sandbox = lease.sandbox_id
            if not self._view.routable(sandbox) and self.leased_on(sandbox) == 0:
                self.last_lease_gone()  # a draining sandbox may stop now, not at the next tick

    def expire_leases(self) -> int:
        """Drop every lease whose TTL passed unrenewed (its capacity returns) and wake every
        waiter whose deadline passed (it answers `NoCapacity`). Returns the leases dropped."""
        gone = self._ledger.expire()
        for lease in gone:
            log.info("lease expired", extra={"lease": lease.lease_id, "sandbox": lease.sandbox_id})
            self._metrics.expired.labels(pool=lease.pool).inc()
        for pool in {lease.pool for lease in gone}:
            self._publish(pool)
        if any(
            not self._view.routable(lease.sandbox_id) and self.leased_on(lease.sandbox_id) == 0
            for lease in gone
        ):
            self.last_lease_gone()
        return len(gone)

    async def _expiry_loop(self) -> None:
        while True:
            await anyio.sleep(self._settings.expiry_interval)
            self.expire_leases()

    async def suspend_idle(self) -> list[str]:
        """One pass of the suspended tier (`activator.suspend`): suspend what is idle, stop
        what nodes evict for memory. Returns the sandboxes suspended."""
        return await self._suspender.tick()

    async def flush_activity(self) -> int:
        """Write last_activity for sandboxes that carried leases, at most once an interval each."""
        return await self._activity.flush()

    # -- reporting --------------------------------------------------------------------------

    def _publish(self, pool: str) -> None:
        if pool in self._view.pools:
            self._metrics.publish(pool, *self._ledger.counts(pool))

    def snapshot(self) -> list[PoolSnapshot]:
        return pool_snapshots(self._view, self._ledger)

    def record_access(self, ingress: str, lines: list[dict[str, object]]) -> int:
        """An ingress's access lines (`Leases.access`), to the log through `access_sink` (set
        by whoever keeps the log), but for apps not known here. Returns how many went in."""
        sink = self.access_sink
        if sink is None:
            return 0
        known = [line for line in lines if line.get("app") in self._view.apps]
        if known:
            sink(ingress, known)
        return len(known)

    def record_traffic(self, report: TrafficReport) -> int:
        """An ingress's traffic report (`Leases.report`), into the charts; apps this activator
        does not know are left out. Returns how many went in."""
        return self._charts.record(report)

    def version_windows(self, app: str, seconds: float) -> dict[str, Window]:
        """What each version of a split or tagged app answered over the last `seconds`, from
        the ingresses' reports (`Charts.versions`); empty for other apps."""
        return self._charts.versions(app, seconds)

    def apps(self) -> list[App]:
        """Every app record, by name."""
        return [self._view.apps[name].value for name in sorted(self._view.apps)]

    def leased_on(self, sandbox_id: str) -> int:
        """Capacity leased on one sandbox (the pool controller stops only sandboxes at 0)."""
        return self._ledger.leased_on(sandbox_id)


class _Reactions:
    """What the activator does, in the same step, about a change the view applied."""

    def __init__(self, activator: Activator) -> None:
        self._activator = activator

    def pool_changed(self, pool: str) -> None:
        self._activator._ledger.wake(pool)

    def pool_removed(self, pool: str) -> None:
        self._activator._ledger.forget_pool(pool)
        self._activator._scale_up.forget(pool)
        self._activator._metrics.forget_pool(pool)

    def sandbox_routable(self, pool: str) -> None:
        self._activator._ledger.wake(pool)

    def sandbox_gone(self, sandbox_id: str) -> None:
        for pool in {lease.pool for lease in self._activator._ledger.lose_leases_on(sandbox_id)}:
            self._activator._publish(pool)

    def sandbox_removed(self, sandbox_id: str) -> None:
        for pool in {lease.pool for lease in self._activator._ledger.forget_sandbox(sandbox_id)}:
            self._activator._publish(pool)
        self._activator._activity.forget(sandbox_id)
        self._activator._suspender.forget(sandbox_id)

    def relisted(self) -> None:
        self._activator._ledger.wake_all()
