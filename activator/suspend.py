"""The suspended tier: freezing idle sandboxes, thawing them before anything starts, and
stopping the longest suspended when a node's memory cap is passed (issue 18).

Theory of operation:
- The activator alone decides, because it alone knows the leases, and only once it knows them
  (`allowed`: admission is open, and after a takeover a lease TTL has passed, so every
  ingress has reported what it holds). Every `TICK` seconds a running sandbox of an `auto`
  pool that its app routes to (a pool rolling out is not suspended), that holds no lease,
  whose pool has no waiter, and that carried no traffic for its app's
  `concurrency.suspend_delay` (counted at the earliest from when this activator first saw it
  routable: a boot does not count, nor the time before a takeover) is withheld from
  admission (`View.withheld`) in the same step as those checks, then written `suspended` by
  compare-and-set on the revision it was decided from. No lease can land on it in between
  (one event loop; the checks and the withholding have no await between them), and a
  conflict (a node's or the pool controller's write) leaves it running. The node freezes a
  sandbox whose record says `suspended` (`wakeful.node.runner`), so a frozen sandbox never
  holds a lease: one adopted meanwhile (a takeover's late report) thaws it as soon as the
  write is done.
- A request that finds nothing routable (or an overflow admission) calls `wake` before any
  scale-up: suspended sandboxes are thawed, as many as the demand needs
  (`decisions.to_thaw`), the most recently suspended first, by compare-and-set back to
  `running`. A thawed record is routable at once (it was ready when frozen): the node thaws
  the process as it sees the record, and a request sent meanwhile waits in the sandbox's
  listen backlog. Demand beyond the suspended sandboxes is the normal scale-up's, which counts
  them in the pool's size (`SIZED`), so it asks only for the rest.
- A node past its cap for suspended memory says how much to give up (`Node.evict_bytes`) and
  lists its frozen sandboxes, the longest suspended first (`Node.evict`). They are stopped in
  that order until what they held adds up to it, each with its pool shrunk by one in one
  transaction (both compare-and-set), so the pool controller does not replace it. Passed
  over: a pool at `min_instances`, or one whose size and sandboxes disagree (a scale-up or a
  scale-down in progress). Counted as given up already, wherever listed: one no longer
  suspended, leased or being thawed (it thaws), or of a retired pool (it stops anyway). So a
  pinned sandbox does not hold the cap hostage, and a list read twice does not have more
  stopped than it asked for.
- Scale-down after `scale_down_delay` stays the idle monitor's: it counts suspended sandboxes
  as idle, and the pool controller stops suspended ones first.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Literal

import anyio
import anyio.abc

from wakeful.activator import decisions
from wakeful.activator.activity import ActivityWriter
from wakeful.activator.ledger import LeaseLedger
from wakeful.activator.metrics import ActivatorMetrics
from wakeful.activator.view import PoolState, View
from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain.lifecycle import Transition, transition
from wakeful.domain.models import STARTING, Sandbox, SandboxStatus, ScaleChange
from wakeful.store import Conflict, Item, Put, Require, Store, StoreError

log = logging.getLogger(__name__)

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
        """The sandboxes to suspend now, withheld from admission in this very step."""
        chosen: list[Item[Sandbox]] = []
        if not self._allowed():
            return chosen
        leased = self._ledger.leased_capacity_by_sandbox
        for state in self._view.pools.values():
            pool = state.item.value
            concurrency = pool.spec.concurrency
            delay = concurrency.suspend_delay
            app = self._view.apps.get(pool.app)
            if (
                delay <= 0
                or concurrency.mode == "fixed"  # fixed: exactly that many, running
                or pool.retired
                or app is None
                or app.value.active_version != pool.version  # rolling out: not routed yet
                or self._ledger.waiting(pool.name)
            ):
                continue
            for sandbox_id in sorted(state.sandboxes):
                item = self._view.sandboxes[sandbox_id]
                sandbox = item.value
                if not self._view.serves(sandbox):
                    self._routable_since.pop(sandbox_id, None)
                    continue
                since = self._routable_since.setdefault(sandbox_id, now)
                if leased.get(sandbox_id, 0):
                    continue
                last = max(
                    sandbox.last_activity,
                    sandbox.created_at,
                    since,
                    self._activity.latest(sandbox_id),
                )
                if now - last >= delay:
                    self._view.withheld.add(sandbox_id)
                    self.thawed.discard(sandbox_id)  # before the write: a thaw may follow it
                    chosen.append(item)
        return chosen

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

    # -- evicting ---------------------------------------------------------------------------

    async def evict(self) -> list[str]:
        """Give up what nodes ask of their suspended memory (`Node.evict_bytes`): stop their
        frozen sandboxes in the order listed (the longest suspended first), each with its
        pool shrunk by one in the same transaction, passing over those that must stay, until
        they add up to what was asked. Every listed one that is suspended no more (stopped,
        thawed, or being thawed), wherever it is in the list, counts as given up already:
        so a list read again before its node wrote the next one stops nothing more, even
        when one passed over then may go now. A write that lost a race ends the node's turn:
        the next tick decides from fresh records. Returns those stopped."""
        stopped: list[str] = []
        for node, record in sorted(self._view.nodes.items()):
            holding = [f for f in record.value.evict if self._still_suspended(f.sandbox, node)]
            given = sum(f.weight for f in record.value.evict) - sum(f.weight for f in holding)
            for frozen in holding:
                if given >= record.value.evict_bytes:
                    break
                if not self._still_suspended(frozen.sandbox, node):
                    given += frozen.weight  # thawed, or gone, while a write was awaited
                    continue
                outcome = await self._evict(frozen.sandbox)
                if outcome == "raced":
                    break
                if outcome == "stopped":
                    given += frozen.weight
                    stopped.append(frozen.sandbox)
        return stopped

    def _still_suspended(self, sandbox_id: str, node: str) -> bool:
        """Whether a listed sandbox still holds its frozen memory, and is not about to give
        it up anyway (thawed: leased or being thawed; stopped: its pool retired)."""
        item = self._view.sandboxes.get(sandbox_id)
        if item is None or item.value.node != node:
            return False
        state = self._view.pools.get(item.value.pool)
        return (
            item.value.status is SandboxStatus.SUSPENDED
            and state is not None
            and not state.item.value.retired
            and sandbox_id not in self._thawing
            and self._ledger.leased_on(sandbox_id) == 0
        )

    async def _evict(self, sandbox_id: str) -> Literal["stopped", "stays", "raced"]:
        """Stop one still suspended sandbox with its pool shrunk by one: "stays" where it
        must (its pool at `min_instances`, or changing size), "raced" where the write lost
        a race."""
        item = self._view.sandboxes[sandbox_id]
        sandbox = item.value
        state = self._view.pools[sandbox.pool]
        pool_item = state.item
        pool = pool_item.value
        if pool.desired_instances <= pool.min_instances:
            return "stays"  # min_instances are kept
        if self._view.live(state) != pool.desired_instances:
            return "stays"  # growing or shrinking: a smaller size would undo that, or doubly
        if any(self._view.sandboxes[s].value.status in STARTING for s in state.sandboxes):
            return "stays"  # the pool is growing: shrinking it now would undo that
        target = pool.desired_instances - 1
        change = ScaleChange(
            at=self._wall_clock(),
            by="memory",
            from_instances=pool.desired_instances,
            to_instances=target,
            reason=f"memory: node {sandbox.node} holds too much for suspended sandboxes; "
            f"stopped {sandbox.id}, suspended the longest",
        )
        smaller = pool.model_copy(update={"desired_instances": target, "last_scale": change})
        stopping = sandbox.model_copy(
            update={
                "status": transition(sandbox.status, Transition.STOP),
                "ready": False,
                "last_log": "stopped while suspended: its node's memory cap for suspended "
                "sandboxes was passed",
            }
        )
        try:
            revision = await self._store.txn(
                [Require(pool_item.key, pool_item.revision), Require(item.key, item.revision)],
                [Put(pool_item.key, smaller), Put(item.key, stopping)],
            )
        except Conflict:
            return "raced"  # decided again from the fresh records on the next tick
        self._metrics.evictions.labels(pool=pool.name).inc()
        log.info(
            "stopped a suspended sandbox for memory",
            extra={"sandbox": sandbox.id, "pool": pool.name},
        )
        self._view.apply_pool(Item(pool_item.key, smaller, revision))
        self._view.apply_sandbox(Item(item.key, stopping, revision))
        return "stopped"
