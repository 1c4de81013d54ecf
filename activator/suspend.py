"""The suspended tier: freezing idle sandboxes, thawing them before anything starts, and
stopping the longest suspended when a node's memory cap is passed (issue 18).

Theory of operation:
- The activator alone decides, because it alone knows the leases. The rules are pure
  (`suspend_decisions`: which sandbox is idle, and why the others are not); this is their
  shell. Every `TICK` seconds it reads the view and the ledger, and in the same step as the
  decision withholds each sandbox chosen from admission (`View.withheld`), then writes it
  `suspended` by compare-and-set on the revision it was decided from. No lease can land on
  it in between (one event loop; the decision and the withholding have no await between
  them), and a conflict (a node's or the pool controller's write) leaves it running. A write
  that ends in a store error may have landed: the sandbox stays withheld until a read says
  which. The node freezes a sandbox whose record says `suspended` (`wakeful.node.sandbox.runner`),
  so a frozen sandbox never holds a lease: one adopted meanwhile (a takeover's late report)
  thaws it as soon as the write is done.
- A request that finds nothing routable (or an overflow admission) calls `wake` before any
  scale-up: suspended sandboxes are thawed, as many as the demand needs
  (`decisions.to_thaw`), the most recently suspended first, by compare-and-set back to
  `running`. A thawed record is routable at once (it was ready when frozen): the node thaws
  the process as it sees the record, and a request sent meanwhile waits in the sandbox's
  listen backlog. Demand beyond the suspended sandboxes is the normal scale-up's, which counts
  them in the pool's size (`SIZED`), so it asks only for the rest.
- Each tick also carries out what nodes ask of their suspended memory (`evict.Evictor`,
  deciding with `suspend_decisions.EvictionTurn`).
- Scale-down after `scale_down_delay` stays the idle monitor's: it counts suspended sandboxes
  as idle, and the pool controller stops suspended ones first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator

import anyio
import anyio.abc

from wakeful.activator import decisions, suspend_decisions
from wakeful.activator.activity import ActivityWriter
from wakeful.activator.evict import Evictor
from wakeful.activator.ledger import LeaseLedger
from wakeful.activator.metrics import ActivatorMetrics
from wakeful.activator.view import PoolState, View
from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain.lifecycle import Transition, transition
from wakeful.domain.models import Sandbox, SandboxStatus
from wakeful.store import Conflict, Item, Store, StoreError

log = logging.getLogger(__name__)
IDLE = suspend_decisions.Why.IDLE

TICK = 1.0
"""Seconds between two looks for idle sandboxes to suspend and evictions to carry out."""
ROUNDS = 5
"""Conflicts in a row after which a thaw gives up (the next request tries again)."""
THAW_BACKOFF = 1.0
"""Seconds a sandbox whose thaw failed on a store error is not tried again."""


class Suspender:
    def __init__(
        self,
        store: Store,
        view: View,
        ledger: LeaseLedger,
        activity: ActivityWriter,
        metrics: ActivatorMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        changed: Callable[[str], None] = lambda pool: None,
        allowed: Callable[[], bool] = lambda: True,
    ) -> None:
        """`changed(pool)`: a sandbox of the pool may have become routable again (a suspend
        that did not happen, a thaw): its waiters run admission. `allowed()`: whether this
        activator knows every lease yet (not during a takeover's first lease TTL)."""
        self._store = store
        self._view = view
        self._ledger = ledger
        self._activity = activity
        self._metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._changed = changed
        self._allowed = allowed
        self._routable_since: dict[str, float] = {}
        """Wall-clock time this activator first saw each sandbox routable (not withheld)."""
        self._backoff_until: dict[str, float] = {}
        """Sandbox id to when (on `clock`) its thaw may be tried again after a store error."""
        self._thawing: dict[str, str] = {}
        """Sandbox id to its pool, while its thaw is being written."""
        self._unsure: dict[str, int] = {}
        """Withheld sandboxes whose suspend write ended in a store error: the revision it was
        decided from. Out of admission until a read says whether the write landed."""
        self.thawed: set[str] = set()
        """Sandboxes this activator thawed (a request that waited for one woke it by `thaw`)."""
        self.tasks: anyio.abc.TaskGroup | None = None
        """Where thaws run; None while the activator is not running (then none starts)."""
        self._evictor = Evictor(
            store, view, ledger, metrics, thawing=self._thawing, wall_clock=wall_clock
        )

    async def run(self) -> None:
        while True:
            await anyio.sleep(TICK)
            try:
                await self.tick()
            except StoreError as exc:
                log.warning("suspended tier: %s", exc)

    async def tick(self) -> list[str]:
        """One pass: settle unsure writes, suspend what is idle, carry out evictions. Returns
        the sandboxes suspended."""
        await self._settle_unsure()
        now = self._wall_clock()
        chosen = self.idle(now)
        suspended = []
        for item in chosen:
            if await self.suspend(item, now):
                suspended.append(item.value.id)
        await self.evict()
        return suspended

    # -- suspending -------------------------------------------------------------------------

    def idle(self, now: float) -> list[Item[Sandbox]]:
        """The sandboxes to suspend now (`suspend_decisions.suspends`), withheld from
        admission in this very step."""
        pools = suspend_decisions.suspends(
            self._observe(), knows_every_lease=self._allowed(), now=now
        )
        chosen: list[Item[Sandbox]] = []
        seen = self._routable_since
        for pool in pools:
            for sandbox_id, why, since in pool.sandboxes:
                if since is None:
                    seen.pop(sandbox_id, None)
                else:
                    seen[sandbox_id] = since
                if why is IDLE:
                    self._view.withheld.add(sandbox_id)
                    self.thawed.discard(sandbox_id)  # before the write: a thaw may follow it
                    chosen.append(self._view.sandboxes[sandbox_id])
        return chosen

    def _observe(self) -> list[suspend_decisions.SuspendPool]:
        """Every pool of the view as the suspend rule reads it; its sandboxes are read only
        if the rule looks at them."""
        found = []
        for state in self._view.pools.values():
            pool = state.item.value
            app = self._view.apps.get(pool.app)
            found.append(
                suspend_decisions.SuspendPool(
                    name=pool.name,
                    suspend_delay=pool.spec.concurrency.suspend_delay,
                    mode=pool.spec.concurrency.mode,
                    retired=pool.retired,
                    routed=app is not None and app.value.active_version == pool.version,
                    waiters=self._ledger.waiting(pool.name),
                    sandboxes=self._idleness(state),
                )
            )
        return found

    def _idleness(self, state: PoolState) -> Iterator[suspend_decisions.Idleness]:
        # Read for every sandbox every second: names bound once.
        sandboxes, serves = self._view.sandboxes, self._view.serves
        leased = self._ledger.leased_capacity_by_sandbox.get
        touched, seen = self._activity.latest, self._routable_since.get
        for sandbox_id in sorted(state.sandboxes):
            sandbox = sandboxes[sandbox_id].value
            yield suspend_decisions.Idleness(
                sandbox_id,
                serves(sandbox),
                leased(sandbox_id, 0),
                sandbox.last_activity,
                sandbox.created_at,
                touched(sandbox_id),
                seen(sandbox_id),
            )

    async def suspend(self, item: Item[Sandbox], now: float) -> bool:
        """Write one sandbox `idle` chose as suspended (it stays withheld until this ends)."""
        sandbox = item.value
        update = {"status": transition(sandbox.status, Transition.SUSPEND), "suspended_at": now}
        frozen = sandbox.model_copy(update=update)
        try:
            revision = await self._store.update(item.key, frozen, expect_revision=item.revision)
        except Conflict:
            self._metrics.suspends.labels(pool=sandbox.pool, result="conflict").inc()
            self._release(sandbox.id, sandbox.pool)
            return False
        except StoreError as exc:
            log.warning("could not suspend: %s", exc, extra={"sandbox": sandbox.id})
            self._metrics.suspends.labels(pool=sandbox.pool, result="failed").inc()
            self._unsure[sandbox.id] = item.revision  # it may have landed: stays withheld
            return False
        self._metrics.suspends.labels(pool=sandbox.pool, result="applied").inc()
        self._view.apply_sandbox(Item(item.key, frozen, revision))
        trace.mark("suspended", sandbox.app)
        log.info("suspended idle sandbox", extra={"sandbox": sandbox.id, "pool": sandbox.pool})
        self._release(sandbox.id, sandbox.pool)
        return True

    def _release(self, sandbox_id: str, pool: str) -> None:
        """Back into admission (or known suspended). A lease adopted on it meanwhile (a
        takeover's late report) thaws it at once; a request that parked meanwhile wakes,
        and thaws it if it is suspended now."""
        self._view.withheld.discard(sandbox_id)
        self._unsure.pop(sandbox_id, None)
        item = self._view.sandboxes.get(sandbox_id)
        if (
            item is not None
            and item.value.status is SandboxStatus.SUSPENDED
            and self._ledger.leased_on(sandbox_id) > 0
        ):
            self.thaw(item)
        self._changed(pool)
        state = self._view.pools.get(pool)
        if state is not None and self._ledger.waiting(state.name):
            self.wake(state)

    async def _settle_unsure(self) -> None:
        """Read each sandbox whose suspend write ended in a store error: whether it landed,
        the view then says (a read that fails leaves it withheld until the next tick)."""
        for sandbox_id, revision in list(self._unsure.items()):
            try:
                fresh = await self._store.get(keys.sandbox(sandbox_id), Sandbox)
            except StoreError as exc:
                log.warning("cannot settle a suspend yet: %s", exc, extra={"sandbox": sandbox_id})
                continue
            if fresh is not None:
                self._view.apply_sandbox(fresh)
            landed = fresh is None or fresh.revision != revision
            log.info(
                "an unsure suspend %s",
                "landed" if landed else "did not land",
                extra={"sandbox": sandbox_id},
            )
            cached = self._view.sandboxes.get(sandbox_id)
            if cached is None:
                self._view.withheld.discard(sandbox_id)
                self._unsure.pop(sandbox_id, None)
            else:
                self._release(sandbox_id, cached.value.pool)

    # -- thawing ----------------------------------------------------------------------------

    def wake(self, state: PoolState) -> int:
        """Thaw as many of the pool's suspended sandboxes as its demand needs, now (no await:
        called on the request path). Returns how many thaws it started."""
        if self.tasks is None:
            return 0
        now = self._clock()
        suspended = [
            i
            for i in self._view.suspended(state)
            if i.value.id not in self._thawing
            and self._backoff_until.get(i.value.id, -math.inf) <= now
        ]
        if not suspended:
            return 0
        pool = state.item.value
        leased = self._ledger.leased_capacity_by_sandbox
        concurrency = pool.spec.concurrency
        count = decisions.to_thaw(
            leased=self._view.leased_on_running(state, leased),
            waiters=self._ledger.waiting(pool.name),
            lease_size=decisions.lease_size(concurrency.mode, pool.requests_per_instance),
            requests_per_instance=pool.requests_per_instance,
            routable=sum(1 for s in state.sandboxes if self._view.routable(s)),
            thawing=sum(1 for p in self._thawing.values() if p == pool.name),
            suspended=len(suspended),
        )
        for item in suspended[:count]:
            self.thaw(item)
        return count

    def thaw(self, item: Item[Sandbox]) -> None:
        """Thaw one suspended sandbox (a request needs it, or a lease on it was adopted)."""
        sandbox = item.value
        if self.tasks is None or sandbox.id in self._thawing:
            return
        self._thawing[sandbox.id] = sandbox.pool
        self.tasks.start_soon(self._thaw, item)

    async def _thaw(self, item: Item[Sandbox]) -> None:
        sandbox_id, pool = item.value.id, item.value.pool
        # Before the write: the watch may bring it back (and a waiter its lease on it) before
        # the write's own answer does.
        self.thawed.add(sandbox_id)
        done = False
        try:
            for _ in range(ROUNDS):
                sandbox = item.value
                if sandbox.status is not SandboxStatus.SUSPENDED:
                    self._changed(pool)  # it went elsewhere: its waiters decide again
                    return
                update = {
                    "status": transition(sandbox.status, Transition.THAW),
                    "suspended_at": 0.0,
                }
                running = sandbox.model_copy(update=update)
                try:
                    revision = await self._store.update(
                        item.key, running, expect_revision=item.revision
                    )
                except Conflict:
                    self._metrics.thaws.labels(pool=pool, result="conflict").inc()
                    fresh = await self._store.get(item.key, Sandbox)
                    if fresh is None:
                        return
                    self._view.apply_sandbox(fresh)
                    item = fresh
                    continue
                self._metrics.thaws.labels(pool=pool, result="applied").inc()
                # Waking is traffic: it must not look idle (and be frozen again) before the
                # request that woke it takes its lease.
                self._activity.touch(sandbox_id, self._wall_clock())
                self._backoff_until.pop(sandbox_id, None)
                done = True
                trace.mark("thawed", sandbox.app)
                self._view.apply_sandbox(Item(item.key, running, revision))  # waiters wake
                return
        except StoreError as exc:
            # No waiter is woken for this: each would only try again at once. The next
            # request (or scale-up) after the backoff does.
            log.warning("could not thaw: %s", exc, extra={"sandbox": sandbox_id})
            self._metrics.thaws.labels(pool=pool, result="failed").inc()
            self._backoff_until[sandbox_id] = self._clock() + THAW_BACKOFF
        finally:
            if not done:
                self.thawed.discard(sandbox_id)
            self._thawing.pop(sandbox_id, None)

    def forget(self, sandbox_id: str) -> None:
        self.thawed.discard(sandbox_id)
        self._unsure.pop(sandbox_id, None)
        self._routable_since.pop(sandbox_id, None)
        self._backoff_until.pop(sandbox_id, None)
        self._view.withheld.discard(sandbox_id)

    async def evict(self) -> list[str]:
        """Stop what nodes ask of their suspended memory (`evict.Evictor`). Returns those
        stopped."""
        return await self._evictor.evict()
