"""Leases and parked waiters: what the activator holds in memory, on one clock.

Theory of operation:
- Every method is synchronous. A step that reads and changes leases or waiters runs without an
  await, which on one event loop is the lock: a waiter granted a lease leaves the waiter list
  in the same step that records the lease, so demand never counts it twice (invariant 6).
- One injected monotonic clock (`clock`) times both: a lease's TTL and a waiter's deadline.
  A caller may bound its real wait by a timeout computed from it, but `expire()` on this
  clock is what decides, so a test moves the clock instead of sleeping.
- A lease's life is the table below. A lease leaves `leases_by_id`, and its size leaves
  `leased_capacity_by_sandbox` and its pool's counts, in the same step that moves it out of
  `active`; an illegal move raises and changes nothing.

      active ──renew──▶ active
      active ──release──▶ released      (the holder handed it back)
      active ──expire──▶ expired        (its TTL passed unrenewed)
      active ──lose──▶ lost             (its sandbox stopped, died or went away)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import anyio

from wakeful.activator import decisions
from wakeful.domain.leases import LeaseGone, LeaseGrant, Overloaded, short


class LeaseState(StrEnum):
    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    LOST = "lost"


class LeaseEvent(StrEnum):
    RENEW = "renew"
    RELEASE = "release"
    EXPIRE = "expire"
    LOSE = "lose"


class IllegalLeaseTransition(ValueError):
    pass


TABLE: dict[tuple[LeaseState, LeaseEvent], LeaseState] = {
    (LeaseState.ACTIVE, LeaseEvent.RENEW): LeaseState.ACTIVE,
    (LeaseState.ACTIVE, LeaseEvent.RELEASE): LeaseState.RELEASED,
    (LeaseState.ACTIVE, LeaseEvent.EXPIRE): LeaseState.EXPIRED,
    (LeaseState.ACTIVE, LeaseEvent.LOSE): LeaseState.LOST,
}


def transition(state: LeaseState, event: LeaseEvent) -> LeaseState:
    try:
        return TABLE[(state, event)]
    except KeyError:
        raise IllegalLeaseTransition(f"a {state.value} lease cannot {event.value}") from None


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
    """On the ledger's clock."""
    state: LeaseState = LeaseState.ACTIVE
    woke_after: float = 0.0
    """Seconds its request waited for the app to wake (parked while nothing of its pool was
    ready); 0 for any other grant. The ingress's `Server-Timing: wake`."""
    woke_by: str = ""
    """How: `thaw` (a suspended sandbox) or `start`; empty unless `woke_after` is set."""
    server_timing: bool = False
    access_log: bool = False
    access_log_query: bool = False
    protocol: str = "http1"
    version: str = ""
    """The version of the pool it is on ("" for one adopted after a takeover)."""

    def grant(self, *, spare_wanted: bool = False) -> LeaseGrant:
        """What the holder is told: the lease as the ingress sees it (`spare_wanted`: on a
        renewal, its pool is short: `LeaseLedger.wants_spares`)."""
        return LeaseGrant(
            lease_id=self.lease_id,
            sandbox_id=self.sandbox_id,
            url=self.url,
            size=self.size,
            overflow=self.overflow,
            ttl_seconds=self.ttl,
            woke_after=self.woke_after,
            woke_by=self.woke_by,
            server_timing=self.server_timing,
            access_log=self.access_log,
            access_log_query=self.access_log_query,
            protocol="h2c" if self.protocol == "h2c" else "http1",
            version=self.version,
            spare_wanted=spare_wanted,
        )


@dataclass(slots=True, eq=False)
class Waiter:
    """A request parked until something in its pool is routable, or its deadline passes."""

    pool: str
    deadline: float
    """On the ledger's clock."""
    wake: anyio.Event = field(default_factory=anyio.Event)
    requests: int = 1
    """The requests it counts as: an ingress's misses share one ask (`Leases.acquire`)."""
    told: int = 1
    """The requests riding it as its holder says (`grow`); `requests` is that, bounded."""
    parked: bool = False


@dataclass(slots=True, eq=False)
class PoolLedger:
    """One pool's waiters and lease counts, kept by pool name."""

    waiters: list[Waiter] = field(default_factory=list)
    requests_waiting: int = 0
    """The requests the waiters stand for, together: the demand that sizes the pool."""
    normal_leases: int = 0
    overflow_leases: int = 0
    forgotten: bool = False
    """The view no longer has the pool: drop this entry once nothing is left in it."""
    short_at: float | None = None
    """When a request of it last got less than a normal lease (`short`)."""

    def idle(self) -> bool:
        return not self.waiters and not self.normal_leases and not self.overflow_leases

    def wake_all(self) -> None:
        for waiter in self.waiters:
            waiter.wake.set()

    def add(self, waiter: Waiter) -> None:
        self.waiters.append(waiter)
        self.requests_waiting += waiter.requests
        waiter.parked = True

    def remove(self, waiter: Waiter) -> None:
        self.waiters.remove(waiter)
        self.requests_waiting -= waiter.requests
        waiter.parked = False


class LeaseLedger:
    def __init__(
        self,
        *,
        lease_ttl: float,
        max_waiters: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self._lease_ttl = lease_ttl
        self._max_waiters = max_waiters
        self.leases_by_id: dict[str, Lease] = {}
        self.leased_capacity_by_sandbox: dict[str, int] = {}
        self._pools: dict[str, PoolLedger] = {}
        self.became_short: Callable[[str], None] = lambda pool: None
        """Told a pool's name as it turns short (`short_of`; `activator.spares`)."""

    # -- reading ----------------------------------------------------------------------------

    def leased_on(self, sandbox_id: str) -> int:
        return self.leased_capacity_by_sandbox.get(sandbox_id, 0)

    def counts(self, pool: str) -> tuple[int, int, int]:
        """(normal leases, overflow leases, requests waiting) of one pool."""
        entry = self._pools.get(pool)
        if entry is None:
            return 0, 0, 0
        return entry.normal_leases, entry.overflow_leases, entry.requests_waiting

    def short_of(self, pool: str) -> None:
        """A request of the pool got less than a normal lease: an overflow one, or a wait
        with every routable sandbox at its hard limit (`wakeful.domain.leases.short`). Its
        holders hear it at once when it was not short already (`became_short`)."""
        entry = self._entry(pool)
        now = self.clock()
        # By `short_at` alone: requests waiting for a cold start make the pool short to a
        # renewal, but nobody was told of them (nothing was routable to hand capacity over).
        was = short(entry.short_at, now)
        entry.short_at = now
        if not was:
            self.became_short(pool)

    def wants_spares(self, pool: str) -> bool:
        """The pool is short: its holders are asked for the normal leases they do not use
        (while requests of it wait, too: `short`)."""
        entry = self._pools.get(pool)
        return entry is not None and short(entry.short_at, self.clock(), entry.requests_waiting)

    def waiting(self, pool: str) -> int:
        """The requests waiting on the pool (a waiter may stand for several)."""
        entry = self._pools.get(pool)
        return 0 if entry is None else entry.requests_waiting

    # -- leases -----------------------------------------------------------------------------

    def grant(self, pool: str, app: str, admitted: decisions.Admit, waiter: Waiter | None) -> Lease:
        """Record an admission; a granted waiter leaves its queue in this same step. An
        overflow lease marks its pool short (`short_of`)."""
        if waiter is not None:
            self._entry(waiter.pool).remove(waiter)
        if admitted.overflow:
            self.short_of(pool)
        lease = self._record(
            uuid.uuid4().hex,
            pool,
            app,
            admitted.sandbox_id,
            admitted.url,
            admitted.size,
            admitted.overflow,
        )
        if waiter is not None and waiter.pool != pool:
            self._tidy(waiter.pool)
        return lease

    def _record(
        self,
        lease_id: str,
        pool: str,
        app: str,
        sandbox_id: str,
        url: str,
        size: int,
        overflow: bool,
    ) -> Lease:
        """A new active lease, counted on its sandbox and its pool."""
        lease = Lease(
            lease_id=lease_id,
            pool=pool,
            app=app,
            sandbox_id=sandbox_id,
            url=url,
            size=size,
            overflow=overflow,
            ttl=self._lease_ttl,
            expires_at=self.clock() + self._lease_ttl,
        )
        self.leases_by_id[lease.lease_id] = lease
        capacity = self.leased_capacity_by_sandbox
        capacity[lease.sandbox_id] = capacity.get(lease.sandbox_id, 0) + lease.size
        entry = self._entry(lease.pool)
        if lease.overflow:
            entry.overflow_leases += 1
        else:
            entry.normal_leases += 1
        return lease

    def adopt(self, pool: str, app: str, grant: LeaseGrant) -> Lease:
        """Record a lease another activator granted and its holder still holds (reported
        after a takeover), under its own id; a lease already known is renewed instead."""
        if grant.lease_id in self.leases_by_id:
            return self.renew(grant.lease_id)
        return self._record(
            grant.lease_id, pool, app, grant.sandbox_id, grant.url, grant.size, grant.overflow
        )

    def renew(self, lease_id: str) -> Lease:
        """Extend a lease's TTL. A lease past its TTL is gone even before `expire()` runs."""
        lease = self.leases_by_id.get(lease_id)
        now = self.clock()
        if lease is None or lease.expires_at <= now:
            raise LeaseGone(f"lease {lease_id!r} expired, was released, or lost its sandbox")
        lease.state = transition(lease.state, LeaseEvent.RENEW)
        lease.expires_at = now + lease.ttl
        return lease

    def release(self, lease_id: str) -> Lease | None:
        """Hand a lease back. Idempotent: an unknown lease id (released, expired) is None."""
        lease = self.leases_by_id.get(lease_id)
        if lease is None:
            return None
        self._end(lease, LeaseEvent.RELEASE)
        return lease

    def lose_leases_on(self, sandbox_id: str) -> list[Lease]:
        """Drop every lease on a sandbox that stopped, died or went away."""
        lost = [lease for lease in self.leases_by_id.values() if lease.sandbox_id == sandbox_id]
        for lease in lost:
            self._end(lease, LeaseEvent.LOSE)
        return lost

    def forget_sandbox(self, sandbox_id: str) -> list[Lease]:
        """The sandbox left the store: lose its leases and anything counted on it."""
        lost = self.lose_leases_on(sandbox_id)
        self.leased_capacity_by_sandbox.pop(sandbox_id, None)
        return lost

    def expire(self) -> list[Lease]:
        """Drop every lease whose TTL passed unrenewed, and wake every waiter whose deadline
        passed (it then gives up). Returns the expired leases."""
        now = self.clock()
        deadlines = {lease_id: lease.expires_at for lease_id, lease in self.leases_by_id.items()}
        gone = [self.leases_by_id[lease_id] for lease_id in decisions.expired(deadlines, now)]
        for lease in gone:
            self._end(lease, LeaseEvent.EXPIRE)
        for entry in self._pools.values():
            for waiter in entry.waiters:
                if waiter.deadline <= now:
                    waiter.wake.set()
        return gone

    def _end(self, lease: Lease, event: LeaseEvent) -> None:
        lease.state = transition(lease.state, event)  # raises before anything changes
        del self.leases_by_id[lease.lease_id]
        capacity = self.leased_capacity_by_sandbox
        left = capacity.get(lease.sandbox_id, 0) - lease.size
        if left > 0:
            capacity[lease.sandbox_id] = left
        else:
            capacity.pop(lease.sandbox_id, None)
        entry = self._entry(lease.pool)
        if lease.overflow:
            entry.overflow_leases -= 1
        else:
            entry.normal_leases -= 1
        entry.wake_all()
        self._tidy(lease.pool)

    # -- waiters ----------------------------------------------------------------------------

    def park(self, pool: str, app: str, deadline: float, requests: int = 1) -> Waiter:
        """Queue an ask standing for `requests` requests on a pool, bounded in depth: it
        counts as many as the pool's room under `max_waiters` holds (those past it ride
        uncounted, as in `grow`); `Overloaded` when the pool has no room at all. Refusing an
        ask whole for its riders past the bound would refuse a cold app's first burst,
        larger than the bound, for ever: the app would never be woken."""
        entry = self._entry(pool)
        room = self._max_waiters - entry.requests_waiting
        if room < 1:
            raise Overloaded(
                f"app {app!r} has {entry.requests_waiting} requests waiting already",
                retry_after=5,
            )
        waiter = Waiter(pool, deadline, requests=min(requests, room), told=requests)
        entry.add(waiter)
        return waiter

    def grow(self, waiter: Waiter, by: int) -> bool:
        """`by` requests joined (left) a parked ask. It counts as the requests riding it, at
        least one, and no more than the pool's room under `max_waiters` (those past it ride
        uncounted until others leave). False when it is no longer parked (granted, gone)."""
        entry = self._pools.get(waiter.pool)
        if entry is None or not waiter.parked:
            return False
        waiter.told += by
        room = self._max_waiters - (entry.requests_waiting - waiter.requests)
        counted = max(1, min(waiter.told, room))
        entry.requests_waiting += counted - waiter.requests
        waiter.requests = counted
        return True

    def unpark(self, waiter: Waiter) -> bool:
        """Take a waiter off its queue (it gave up or was cancelled); False if it was not on."""
        entry = self._pools.get(waiter.pool)
        if entry is None or waiter not in entry.waiters:
            return False
        entry.remove(waiter)
        self._tidy(waiter.pool)
        return True

    def move(self, waiter: Waiter, pool: str) -> None:
        """Follow a route to another pool, keeping the request's deadline."""
        if waiter.pool == pool:
            return
        self.unpark(waiter)
        waiter.pool = pool
        self._entry(pool).add(waiter)

    def wake(self, pool: str) -> None:
        """Every waiter of the pool runs admission again."""
        entry = self._pools.get(pool)
        if entry is not None:
            entry.wake_all()

    def wake_all(self) -> None:
        for entry in self._pools.values():
            entry.wake_all()

    def forget_pool(self, pool: str) -> None:
        """The view dropped the pool: wake its waiters (they follow the route or give up), and
        keep its counts only while leases or waiters remain."""
        entry = self._pools.get(pool)
        if entry is not None:
            entry.wake_all()
            entry.forgotten = True
            self._tidy(pool)

    def _entry(self, pool: str) -> PoolLedger:
        entry = self._pools.get(pool)
        if entry is None:
            entry = self._pools[pool] = PoolLedger()
        return entry

    def _tidy(self, pool: str) -> None:
        entry = self._pools.get(pool)
        if entry is not None and entry.forgotten and entry.idle():
            del self._pools[pool]
