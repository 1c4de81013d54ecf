"""The activator: admission, leases, parked waiters and scale-up over a watched view.

Theory of operation:
- The view (apps, pools, sandboxes) is written by the sync task from store watches, and by a
  scale-up applying what it wrote or re-read. Every write to it takes only a newer revision.
- Leases and waiters live only here, in memory. Every step that reads and changes them runs
  without an await in between; on one event loop that is the lock. So a waiter that gets a
  lease leaves the waiter list in the same step (it is never counted as both).
- A request parks only when nothing in its pool is routable. A sandbox becoming routable, a
  release, a pool update and a resync wake every waiter of the pool; each re-runs admission.
- Scale-ups run in the activator's task group, one per pool at a time, and write only with
  compare-and-set against the revision they computed from. On conflict they re-read and
  decide again; they never write a number computed from a stale pool.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Gauge

from wakeful.activator import decisions
from wakeful.activator.metrics import ActivatorMetrics
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.leases import (
    AppFailedToBoot,
    LeaseGone,
    LeaseGrant,
    NoCapacity,
    Overloaded,
    UnknownApp,
)
from wakeful.domain.models import App, Pool, Sandbox, SandboxStatus
from wakeful.store import Conflict, CorruptValue, Event, Item, Resync, Store, StoreError

log = logging.getLogger(__name__)

GONE = frozenset({SandboxStatus.STOPPING, SandboxStatus.STOPPED, SandboxStatus.DEAD})
"""Statuses whose leases are dropped. A draining sandbox keeps its leases until released."""
LIVE = frozenset({SandboxStatus.PENDING, SandboxStatus.BOOTING, SandboxStatus.RUNNING})


@dataclass(slots=True)
class Lease:
    lease_id: str
    pool: str
    app: str
    sandbox_id: str
    url: str
    size: int
    overflow: bool
    ttl: float
    expires_at: float

    def grant(self) -> LeaseGrant:
        """What the holder is told: the lease as the ingress sees it."""
        return LeaseGrant(
            lease_id=self.lease_id,
            sandbox_id=self.sandbox_id,
            url=self.url,
            size=self.size,
            overflow=self.overflow,
            ttl_seconds=self.ttl,
        )


@dataclass(slots=True, eq=False)
class Waiter:
    wake: anyio.Event = field(default_factory=anyio.Event)


@dataclass(slots=True, eq=False)
class PoolState:
    item: Item[Pool]
    sandboxes: set[str] = field(default_factory=set)
    waiters: list[Waiter] = field(default_factory=list)
    normal_leases: int = 0
    overflow_leases: int = 0
    gauges: tuple[Gauge, Gauge, Gauge] | None = None
    scaling: bool = False
    backoff_until: float = 0.0
    last_reread: float = -math.inf

    @property
    def name(self) -> str:
        return self.item.value.name

    def wake_all(self) -> None:
        for waiter in self.waiters:
            waiter.wake.set()


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    pool: str
    app: str
    version: str
    state: str
    """`active` (takes traffic), `draining` (retired, sandboxes still finishing) or `retired`."""
    desired_instances: int
    """What the pool controller acts on: 0 for a retired pool, whatever its record says."""
    live: int
    ready: int
    leased: int
    overflow: int
    waiters: int
    revision: int


class Activator:
    def __init__(
        self,
        store: Store,
        settings: ActivatorSettings,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._metrics = ActivatorMetrics(registry)
        self._apps: dict[str, Item[App]] = {}
        self._pools: dict[str, PoolState] = {}
        self._sandboxes: dict[str, Item[Sandbox]] = {}
        self._leases: dict[str, Lease] = {}
        self._leased: dict[str, int] = {}
        self._activity: dict[str, float] = {}
        self._activity_written: dict[str, float] = {}
        self._synced = anyio.Event()
        self._tasks: anyio.abc.TaskGroup | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, *, watch: bool = True) -> AsyncIterator[Activator]:
        """Run the activator's loops for the duration of the block.

        With `watch=False` the view is loaded once and then changes only through `resync()`
        and the activator's own writes: tests use it to hold the view stale on purpose.
        """
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            if watch:
                tasks.start_soon(self._sync_loop)
            else:
                await self.resync()
            tasks.start_soon(self._expiry_loop)
            tasks.start_soon(self._activity_loop)
            with anyio.fail_after(60):
                await self._synced.wait()
            try:
                yield self
            finally:
                tasks.cancel_scope.cancel()
                self._tasks = None

    # -- the view ---------------------------------------------------------------------------

    async def resync(self) -> int:
        """Re-list everything, refresh what the store has moved past, wake every waiter.

        Returns the revision to watch from, minus one.
        """
        apps = await self._store.list("apps/", App)
        pools = await self._store.list("pools/", Pool)
        sandboxes = await self._store.list("sandboxes/", Sandbox)
        app_names = {a.value.name for a in apps.items}
        for name in [n for n, cached in self._apps.items() if n not in app_names]:
            if self._apps[name].revision <= apps.revision:
                del self._apps[name]
        for app in apps.items:
            self._apply_app(app)
        pool_items = {p.value.name: p for p in pools.items}
        for name in [n for n, ps in self._pools.items() if n not in pool_items]:
            if self._pools[name].item.revision <= pools.revision:
                self._remove_pool(name)
        for item in pools.items:
            self._apply_pool(item)
        listed = {s.value.id for s in sandboxes.items}
        for sandbox_id in [s for s in self._sandboxes if s not in listed]:
            if self._sandboxes[sandbox_id].revision <= sandboxes.revision:
                self._remove_sandbox(sandbox_id)
        for sandbox in sandboxes.items:
            self._apply_sandbox(sandbox)
        self._synced.set()
        for ps in self._pools.values():
            ps.wake_all()
        return min(apps.revision, pools.revision, sandboxes.revision)

    async def _sync_loop(self) -> None:
        while True:
            try:
                revision = await self.resync()
                async for change in self._store.watch("", revision + 1):
                    if isinstance(change, Resync):
                        log.warning("store watch lost continuity (%s); re-listing", change.reason)
                        break
                    self._apply_event(change)
            except StoreError as exc:
                log.warning("store unavailable for the activator's view: %s", exc)
                await anyio.sleep(1)

    def _apply_event(self, event: Event) -> None:
        kind, _, name = event.key.partition("/")
        try:
            if kind == "apps":
                if event.kind == "delete":
                    cached = self._apps.get(name)
                    if cached is not None and cached.revision < event.revision:
                        del self._apps[name]
                else:
                    self._apply_app(Item(event.key, event.decode(App), event.revision))
            elif kind == "pools":
                if event.kind == "delete":
                    state = self._pools.get(name)
                    if state is not None and state.item.revision < event.revision:
                        self._remove_pool(name)
                else:
                    self._apply_pool(Item(event.key, event.decode(Pool), event.revision))
            elif kind == "sandboxes":
                if event.kind == "delete":
                    cached_sandbox = self._sandboxes.get(name)
                    if cached_sandbox is not None and cached_sandbox.revision < event.revision:
                        self._remove_sandbox(name)
                else:
                    self._apply_sandbox(Item(event.key, event.decode(Sandbox), event.revision))
        except CorruptValue as exc:
            log.error("ignoring an invalid value in the store: %s", exc)

    def _apply_app(self, item: Item[App]) -> None:
        cached = self._apps.get(item.value.name)
        if cached is None or item.revision > cached.revision:
            self._apps[item.value.name] = item

    def _apply_pool(self, item: Item[Pool]) -> None:
        state = self._pools.get(item.value.name)
        if state is None:
            state = self._pools[item.value.name] = PoolState(item)
            state.sandboxes = {
                s for s, sb in self._sandboxes.items() if sb.value.pool == item.value.name
            }
        elif item.revision <= state.item.revision:
            return
        state.item = item
        state.wake_all()

    def _remove_pool(self, name: str) -> None:
        state = self._pools.pop(name)
        state.wake_all()
        self._metrics.forget_pool(name)

    def _apply_sandbox(self, item: Item[Sandbox]) -> None:
        sandbox = item.value
        cached = self._sandboxes.get(sandbox.id)
        if cached is not None and item.revision <= cached.revision:
            return
        self._sandboxes[sandbox.id] = item
        state = self._pools.get(sandbox.pool)
        if state is not None:
            state.sandboxes.add(sandbox.id)
        if sandbox.status in GONE:
            self._drop_leases_on(sandbox.id)
        was_routable = cached is not None and cached.value.routable
        if sandbox.routable and not was_routable and state is not None:
            state.wake_all()

    def _remove_sandbox(self, sandbox_id: str) -> None:
        item = self._sandboxes.pop(sandbox_id)
        state = self._pools.get(item.value.pool)
        if state is not None:
            state.sandboxes.discard(sandbox_id)
        self._drop_leases_on(sandbox_id)
        self._leased.pop(sandbox_id, None)
        self._activity.pop(sandbox_id, None)
        self._activity_written.pop(sandbox_id, None)

    # -- admission --------------------------------------------------------------------------

    def _resolve(self, app: str, version: str | None) -> PoolState:
        found = self._apps.get(app)
        if found is None:
            raise UnknownApp(f"no app named {app!r}")
        version = version or found.value.active_version
        if version is None:
            raise UnknownApp(f"app {app!r} has no active version")
        for state in self._pools.values():
            pool = state.item.value
            if pool.app == app and pool.version == version and not pool.retired:
                return state
        raise UnknownApp(f"app {app!r} has no pool for version {version!r}")

    def _candidates(self, state: PoolState) -> list[decisions.Candidate]:
        found = []
        for sandbox_id in sorted(state.sandboxes):
            sandbox = self._sandboxes[sandbox_id].value
            if sandbox.routable and sandbox.address:
                url = sandbox.address
                if "://" not in url:
                    url = f"http://{url}"
                found.append(decisions.Candidate(sandbox_id, url, self._leased.get(sandbox_id, 0)))
        return found

    async def acquire(self, app: str, version: str | None = None) -> Lease:
        """A lease on a sandbox of the app's pool, waiting (bounded) only when none is routable."""
        await self._synced.wait()
        state = self._resolve(app, version)
        started = anyio.current_time()
        deadline = started + state.item.value.spec.activation_timeout
        waiter: Waiter | None = None
        try:
            while True:
                if self._pools.get(state.name) is not state or state.item.value.retired:
                    # A deploy retired this pool (or it went away): follow the app's route to
                    # its new pool, taking this request's place in the queue along.
                    fresh = self._resolve(app, version)
                    if waiter is not None and fresh is not state:
                        if waiter in state.waiters:
                            state.waiters.remove(waiter)
                            self._publish(state)
                        fresh.waiters.append(waiter)
                    state = fresh
                if waiter is not None:
                    waiter.wake = anyio.Event()
                lease = self._try_admit(state, waiter)
                if lease is not None:
                    self._metrics.wait.observe(anyio.current_time() - started)
                    return lease
                self._fail_if_crashing(state)
                if waiter is None:
                    if len(state.waiters) >= self._settings.max_waiters:
                        raise Overloaded(
                            f"app {app!r} has {len(state.waiters)} requests waiting already",
                            retry_after=5,
                        )
                    waiter = Waiter()
                    state.waiters.append(waiter)
                    self._publish(state)
                self._start_scale_up(state)
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    raise NoCapacity(
                        f"no sandbox of app {app!r} became ready within "
                        f"{state.item.value.spec.activation_timeout:g} s",
                        retry_after=5,
                    )
                with anyio.move_on_after(remaining):
                    await waiter.wake.wait()
        finally:
            if waiter is not None and waiter in state.waiters:
                state.waiters.remove(waiter)
                self._publish(state)

    def _try_admit(self, state: PoolState, waiter: Waiter | None) -> Lease | None:
        pool = state.item.value
        mode = pool.spec.concurrency.mode
        decision = decisions.admit(self._candidates(state), mode, pool.requests_per_instance)
        if isinstance(decision, decisions.Park):
            return None
        if waiter is not None:
            state.waiters.remove(waiter)  # same step as the grant: never lease and waiter both
        now = self._clock()
        lease = Lease(
            lease_id=uuid.uuid4().hex,
            pool=pool.name,
            app=pool.app,
            sandbox_id=decision.sandbox_id,
            url=decision.url,
            size=decision.size,
            overflow=decision.overflow,
            ttl=self._settings.lease_ttl,
            expires_at=now + self._settings.lease_ttl,
        )
        self._leases[lease.lease_id] = lease
        self._leased[lease.sandbox_id] = self._leased.get(lease.sandbox_id, 0) + lease.size
        self._activity[lease.sandbox_id] = now
        if decision.overflow:
            state.overflow_leases += 1
            self._metrics.overflow.labels(pool=pool.name).inc()
            self._start_scale_up(state)
        else:
            state.normal_leases += 1
        self._publish(state)
        return lease

    def _fail_if_crashing(self, state: PoolState) -> None:
        pool = state.item.value
        now = self._clock()
        if pool.crash_cooldown_until > now:
            raise AppFailedToBoot(
                f"app {pool.app!r} failed to boot ({pool.crash_count} crashes in a row)",
                retry_after=pool.crash_cooldown_until - now,
                log=pool.last_crash_log,
            )

    def renew(self, lease_id: str, *, used: bool = False) -> Lease:
        """Extend a lease's TTL; `used` says it carried traffic since the last renew."""
        lease = self._leases.get(lease_id)
        now = self._clock()
        if lease is None or lease.expires_at <= now:
            raise LeaseGone(f"lease {lease_id!r} expired, was released, or lost its sandbox")
        lease.expires_at = now + lease.ttl
        if used:
            self._activity[lease.sandbox_id] = now
        sandbox = self._sandboxes.get(lease.sandbox_id)
        if sandbox is None or not sandbox.value.routable:
            # Draining: the lease stays valid (renewed just now) for the requests already on
            # it, which finish and release it; the holder must not start new ones there.
            raise LeaseGone(f"lease {lease_id!r} is on a sandbox that is leaving admission")
        return lease

    def release(self, lease_id: str) -> None:
        """Hand a lease back. Idempotent: a second release, or one after expiry, is a no-op."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        self._activity[lease.sandbox_id] = self._clock()
        self._drop(lease)

    def _drop(self, lease: Lease) -> None:
        del self._leases[lease.lease_id]
        left = self._leased.get(lease.sandbox_id, 0) - lease.size
        if left > 0:
            self._leased[lease.sandbox_id] = left
        else:
            self._leased.pop(lease.sandbox_id, None)
        state = self._pools.get(lease.pool)
        if state is not None:
            if lease.overflow:
                state.overflow_leases -= 1
            else:
                state.normal_leases -= 1
            state.wake_all()
            self._publish(state)

    def _drop_leases_on(self, sandbox_id: str) -> None:
        for lease in [lease for lease in self._leases.values() if lease.sandbox_id == sandbox_id]:
            self._drop(lease)

    def expire_leases(self) -> int:
        """Drop every lease whose TTL passed unrenewed; its capacity returns."""
        now = self._clock()
        deadlines = {lease_id: lease.expires_at for lease_id, lease in self._leases.items()}
        gone = decisions.expired(deadlines, now)
        for lease_id in gone:
            lease = self._leases[lease_id]
            log.info("lease expired", extra={"lease": lease_id, "sandbox": lease.sandbox_id})
            self._metrics.expired.labels(pool=lease.pool).inc()
            self._drop(lease)
        return len(gone)

    async def _expiry_loop(self) -> None:
        while True:
            await anyio.sleep(self._settings.expiry_interval)
            self.expire_leases()

    # -- scale-up ---------------------------------------------------------------------------

    def _live(self, state: PoolState) -> int:
        return sum(1 for s in state.sandboxes if self._sandboxes[s].value.status in LIVE)

    def _leased_on_running(self, state: PoolState) -> int:
        return sum(
            self._leased.get(s, 0)
            for s in state.sandboxes
            if self._sandboxes[s].value.status is SandboxStatus.RUNNING
        )

    def _start_scale_up(self, state: PoolState) -> None:
        if state.scaling:
            return
        pool = state.item.value
        if pool.spec.concurrency.mode == "fixed" or self._tasks is None:
            return
        now = self._clock()
        gate = decisions.scale_up_gate(
            in_flight=state.scaling,
            now=now,
            backoff_until=state.backoff_until,
            desired=pool.desired_instances,
            max_instances=pool.max_instances,
            reread_due=decisions.reread_due(
                desired=pool.desired_instances,
                live=self._live(state),
                now=now,
                last_reread=state.last_reread,
            ),
        )
        if gate is not decisions.Gate.PROCEED:
            if gate is not decisions.Gate.IN_FLIGHT:
                self._metrics.scale_ups.labels(pool=pool.name, result=gate.value).inc()
            return
        state.scaling = True
        self._tasks.start_soon(self._scale_up, state)

    async def _scale_up(self, state: PoolState) -> None:
        try:
            for _ in range(10):
                item = state.item
                pool = item.value
                now = self._clock()
                plan = decisions.plan_scale_up(
                    leased=self._leased_on_running(state),
                    waiters=len(state.waiters),
                    lease_size=decisions.lease_size("auto", pool.requests_per_instance),
                    requests_per_instance=pool.requests_per_instance,
                    desired=pool.desired_instances,
                    max_instances=pool.max_instances,
                    live=self._live(state),
                    now=now,
                    last_reread=state.last_reread,
                )
                if plan.step is decisions.Step.COVERED:
                    return
                if plan.step is decisions.Step.REREAD:
                    state.last_reread = now
                    if not await self._reread(state):
                        return
                    continue
                grown = pool.model_copy(update={"desired_instances": plan.target})
                try:
                    revision = await self._store.update(
                        item.key, grown, expect_revision=item.revision
                    )
                except Conflict:
                    self._metrics.scale_ups.labels(pool=pool.name, result="conflict").inc()
                    if not await self._reread(state):
                        return
                    continue
                self._metrics.scale_ups.labels(pool=pool.name, result="applied").inc()
                log.info(
                    "scaled up %s from %d to %d",
                    pool.name,
                    pool.desired_instances,
                    plan.target,
                    extra={"pool": pool.name},
                )
                self._apply_pool(Item(item.key, grown, revision))
            state.backoff_until = self._clock() + self._settings.scale_up_backoff
        except StoreError as exc:
            log.warning("scale-up of %s failed: %s", state.name, exc, extra={"pool": state.name})
            self._metrics.scale_ups.labels(pool=state.name, result="failed").inc()
            state.backoff_until = self._clock() + self._settings.scale_up_backoff
        finally:
            state.scaling = False

    async def _reread(self, state: PoolState) -> bool:
        """Refresh the pool from the store (newer revisions only); False if it is gone."""
        fresh = await self._store.get(state.item.key, Pool)
        if fresh is None:
            if self._pools.get(state.name) is state:
                self._remove_pool(state.name)
            return False
        self._apply_pool(fresh)
        return True

    # -- activity ---------------------------------------------------------------------------

    async def _activity_loop(self) -> None:
        while True:
            await anyio.sleep(0.5)
            await self.flush_activity()

    async def flush_activity(self) -> int:
        """Write last_activity for sandboxes that carried leases, at most once an interval each."""
        now = self._clock()
        written = 0
        for sandbox_id, when in list(self._activity.items()):
            item = self._sandboxes.get(sandbox_id)
            if item is None or item.value.last_activity >= when:
                self._activity.pop(sandbox_id, None)
                continue
            last = self._activity_written.get(sandbox_id, -math.inf)
            if now - last < self._write_interval(item.value.pool):
                continue
            touched = item.value.model_copy(update={"last_activity": when})
            try:
                revision = await self._store.update(
                    item.key, touched, expect_revision=item.revision
                )
            except Conflict:
                continue  # the watch brings the newer record; try again next round
            except StoreError as exc:
                log.warning("could not record activity: %s", exc, extra={"sandbox": sandbox_id})
                return written
            self._apply_sandbox(Item(item.key, touched, revision))
            self._activity_written[sandbox_id] = now
            if self._activity.get(sandbox_id) == when:
                del self._activity[sandbox_id]
            written += 1
        return written

    def _write_interval(self, pool: str) -> float:
        """At most every activity_write_interval, and often enough that the idle monitor never
        mistakes a busy sandbox for an idle one (a third of the pool's scale_down_delay)."""
        state = self._pools.get(pool)
        delay = state.item.value.spec.concurrency.scale_down_delay if state else math.inf
        return min(self._settings.activity_write_interval, delay / 3)

    # -- reporting --------------------------------------------------------------------------

    def _publish(self, state: PoolState) -> None:
        gauges = state.gauges
        if gauges is None:
            gauges = state.gauges = (
                self._metrics.leases.labels(pool=state.name, kind="normal"),
                self._metrics.leases.labels(pool=state.name, kind="overflow"),
                self._metrics.waiters.labels(pool=state.name),
            )
        gauges[0].set(state.normal_leases)
        gauges[1].set(state.overflow_leases)
        gauges[2].set(len(state.waiters))

    def snapshot(self) -> list[PoolSnapshot]:
        found = []
        for name in sorted(self._pools):
            state = self._pools[name]
            pool = state.item.value
            live = self._live(state)
            found.append(
                PoolSnapshot(
                    pool=name,
                    app=pool.app,
                    version=pool.version,
                    state=("draining" if live else "retired") if pool.retired else "active",
                    desired_instances=0 if pool.retired else pool.desired_instances,
                    live=live,
                    ready=sum(1 for s in state.sandboxes if self._sandboxes[s].value.routable),
                    leased=sum(self._leased.get(s, 0) for s in state.sandboxes),
                    overflow=state.overflow_leases,
                    waiters=len(state.waiters),
                    revision=state.item.revision,
                )
            )
        return found

    def leased_on(self, sandbox_id: str) -> int:
        """Capacity leased on one sandbox (the pool controller stops only sandboxes at 0)."""
        return self._leased.get(sandbox_id, 0)
