"""The suspended tier's decisions: which sandboxes to suspend, and which to stop when a node
holds too much for its suspended sandboxes (invariant 24, design/suspended-tier.md).

No I/O, no clock reads, no awaits: `activator/suspend.py` and `activator/evict.py` gather a
snapshot from the view and the ledger, call these, and write what they return by
compare-and-set.

Suspend. A sandbox is suspended only when
- this activator knows every lease (admission is open; after a takeover, a lease TTL later);
- its pool has `suspend_delay > 0`, is `auto` (a fixed pool keeps exactly its size running),
  is not retired, is the pool its app routes to (a pool rolling out is not suspended: its
  rollout counts routable sandboxes) and has no waiter;
- it is in admission (routable, reachable, not being suspended already) and holds no lease;
- and it carried no traffic for the delay, counted from the newest of its `last_activity`,
  the activator's unwritten touches, its creation (a boot is not idleness) and when this
  activator first saw it routable (nor is the time before a takeover).
The same decision says what to remember of when each sandbox was first seen routable: now
for one seen for the first time, nothing for one out of admission, and no change for the
sandboxes of a pool that keeps them all (they are not looked at).

Evict. A node asks for bytes (`evict_bytes`) and lists its frozen sandboxes, the longest
suspended first. Every listed one that gives its memory up anyway counts as given before the
walk, wherever it is listed: no longer suspended on that node, of a retired pool (it stops
anyway), being thawed, or leased (it thaws). The walk then takes the others in order until
what was given adds up to what was asked: one that gave up meanwhile counts as given, one
that must stay is passed over (its pool at `min_instances`, its pool's size and live
sandboxes disagreeing, a sandbox of its pool starting: a stop then would undo a scale-up or
shrink twice), and the rest are stopped with their pool shrunk by one. A write that lost a
race ends the node's turn. Counting before the walk is what keeps a list read twice (the
node writes one every 2 s, the activator looks every second) from stopping twice as much.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from wakeful.activator.decisions import Mode

# -- suspend -------------------------------------------------------------------------------


class Why(StrEnum):
    """Why a sandbox is suspended (`IDLE`), or why not."""

    IDLE = "idle for its delay"
    LEASES_UNKNOWN = "not every lease is known yet"
    DELAY_OFF = "its app's suspend_delay is 0"
    FIXED = "a fixed pool keeps its size running"
    RETIRED = "its pool is retired"
    NOT_ROUTED = "its app does not route to its pool"
    WAITERS = "its pool has waiters"
    OUT_OF_ADMISSION = "it is not in admission"
    LEASED = "it holds a lease"
    RECENT = "it carried traffic within the delay"


# The suspend rule reads every sandbox every second: its inputs and verdicts are named
# tuples, which cost a fraction of a frozen dataclass to build (`activator/suspend.py`
# builds the sandboxes' lazily, only for pools that do not keep them all).


class Idleness(NamedTuple):
    """A sandbox as the suspend rule sees it. Times are wall-clock seconds; 0 for never."""

    sandbox_id: str
    in_admission: bool
    """Routable, reachable and not withheld (`View.serves`)."""
    leased: int
    last_activity: float
    created_at: float
    touched: float
    """The activator's newest touch not yet written to `last_activity`."""
    seen_since: float | None
    """When this activator first saw it routable; None: not seen yet."""


class SuspendPool(NamedTuple):
    name: str
    suspend_delay: float
    mode: Mode
    retired: bool
    routed: bool
    """Its app exists and routes to this pool's version."""
    waiters: int
    sandboxes: Iterable[Idleness]
    """Read only when the pool itself does not keep them all (it may be a generator)."""


class SuspendVerdict(NamedTuple):
    sandbox_id: str
    why: Why
    seen_since: float | None
    """What to remember of when it was first seen routable (None: forget it)."""

    @property
    def suspend(self) -> bool:
        return self.why is Why.IDLE


class PoolVerdict(NamedTuple):
    pool: str
    kept: Why | None
    """Why none of the pool's sandboxes is suspended, when the pool decides it: then its
    sandboxes are not looked at, and what was seen of them stays as it was."""
    sandboxes: tuple[SuspendVerdict, ...] = ()


def suspends(
    pools: Iterable[SuspendPool], *, knows_every_lease: bool, now: float
) -> list[PoolVerdict]:
    """A verdict for every pool, and for every sandbox of a pool that does not keep them."""
    verdicts = []
    for pool in pools:
        kept = _pool_keeps(pool, knows_every_lease)
        if kept is not None:
            verdicts.append(PoolVerdict(pool.name, kept))
        else:
            verdicts.append(PoolVerdict(pool.name, None, _verdicts(pool, now)))
    return verdicts


def _pool_keeps(pool: SuspendPool, knows_every_lease: bool) -> Why | None:
    """Why none of the pool's sandboxes is suspended, if none is."""
    if not knows_every_lease:
        return Why.LEASES_UNKNOWN
    if pool.suspend_delay <= 0:
        return Why.DELAY_OFF
    if pool.mode == "fixed":
        return Why.FIXED
    if pool.retired:
        return Why.RETIRED
    if not pool.routed:
        return Why.NOT_ROUTED
    if pool.waiters:
        return Why.WAITERS
    return None


def _verdicts(pool: SuspendPool, now: float) -> tuple[SuspendVerdict, ...]:
    return tuple([_verdict(sandbox, pool.suspend_delay, now) for sandbox in pool.sandboxes])


def _verdict(sandbox: Idleness, delay: float, now: float) -> SuspendVerdict:
    sandbox_id, in_admission, leased, last_activity, created_at, touched, seen = sandbox
    if not in_admission:
        return SuspendVerdict(sandbox_id, _OUT_OF_ADMISSION, None)
    since = now if seen is None else seen
    if leased:
        return SuspendVerdict(sandbox_id, _LEASED, since)
    idle = now - max(last_activity, created_at, since, touched) >= delay
    return SuspendVerdict(sandbox_id, _IDLE if idle else _RECENT, since)


# Read once: on Python 3.11 a member looked up on its enum class costs as much as the rest of
# a verdict.
_OUT_OF_ADMISSION, _LEASED, _IDLE, _RECENT = Why.OUT_OF_ADMISSION, Why.LEASED, Why.IDLE, Why.RECENT


# -- evict ---------------------------------------------------------------------------------


class Evict(StrEnum):
    """What to do with one listed sandbox, as things are now."""

    STOP = "stop it, its pool shrunk by one"
    GONE = "no longer suspended on this node"
    RETIRED = "its pool is retired or gone: it stops anyway"
    THAWING = "it is being thawed"
    LEASED = "it holds a lease: it thaws"
    PINNED = "its pool is at min_instances"
    RESIZING = "its pool's size and live sandboxes disagree"
    STARTING = "a sandbox of its pool is starting"

    @property
    def given(self) -> bool:
        """It gives its memory up without being stopped."""
        return self in _GIVEN


_GIVEN = frozenset({Evict.GONE, Evict.RETIRED, Evict.THAWING, Evict.LEASED})


@dataclass(frozen=True, slots=True)
class Listed:
    """A frozen sandbox a node lists, as the view has it now."""

    sandbox_id: str
    weight: int
    """What giving it up counts for (`Frozen.weight`)."""
    pool: str
    on_node: bool
    """The view has it, placed on the node that lists it."""
    suspended: bool
    thawing: bool
    leased: int


@dataclass(frozen=True, slots=True)
class PoolSize:
    retired: bool
    desired: int
    min_instances: int
    live: int
    """Its sandboxes counted in its size (`SIZED`)."""
    starting: bool
    """One of its sandboxes is pending or booting."""


def eviction(listed: Listed, pool: PoolSize | None) -> Evict:
    """What to do with one listed sandbox; `pool` is its pool (None: not in the view)."""
    if not listed.on_node or not listed.suspended:
        return Evict.GONE
    if pool is None or pool.retired:
        return Evict.RETIRED
    if listed.thawing:
        return Evict.THAWING
    if listed.leased:
        return Evict.LEASED
    if pool.desired <= pool.min_instances:
        return Evict.PINNED
    if pool.live != pool.desired:
        return Evict.RESIZING
    if pool.starting:
        return Evict.STARTING
    return Evict.STOP


class TurnOver(ValueError):
    """A step of an eviction turn that is not the next one (the turn stays as it was)."""


@dataclass(slots=True)
class EvictionTurn:
    """One node's turn: the listed sandboxes still to decide on, and what was given.

    The shell asks `next` for the one to decide on, decides with `eviction` from the view
    as it is then (a write before may have changed it), and says what came of it:
    `passed(verdict)`, `stopped()` or `raced()`."""

    asked: int
    given: int
    ahead: list[Listed]
    over: bool = False

    @classmethod
    def start(
        cls, asked: int, listed: Sequence[Listed], pools: Mapping[str, PoolSize]
    ) -> EvictionTurn:
        holding = [f for f in listed if not eviction(f, pools.get(f.pool)).given]
        given = sum(f.weight for f in listed) - sum(f.weight for f in holding)
        return cls(asked, given, holding)

    def next(self) -> Listed | None:
        """The next one to decide on; None once enough was given, every one was looked at,
        or a write lost a race."""
        if self.over or self.given >= self.asked or not self.ahead:
            return None
        return self.ahead[0]

    def passed(self, verdict: Evict) -> None:
        """The next one was not stopped: it gave up meanwhile (counted), or must stay."""
        if verdict is Evict.STOP:
            raise TurnOver("a sandbox to stop is `stopped` or `raced`, not passed")
        head = self._head()
        if verdict.given:
            self.given += head.weight

    def stopped(self) -> None:
        self.given += self._head().weight

    def raced(self) -> None:
        """The write lost a race: the next tick decides again from fresh records."""
        self._head()
        self.over = True

    def _head(self) -> Listed:
        if self.next() is None:
            raise TurnOver("the turn is over")
        return self.ahead.pop(0)


def plan_evictions(
    asked: int, listed: Sequence[Listed], pools: Mapping[str, PoolSize]
) -> list[str]:
    """The sandboxes a turn stops, in order, when every write lands and nothing else changes
    meanwhile (each stop shrinks its pool by one, desired and live alike): the shell's walk,
    played on a snapshot."""
    pools = dict(pools)
    now = {f.sandbox_id: f for f in listed}
    turn = EvictionTurn.start(asked, listed, pools)
    stops = []
    while (head := turn.next()) is not None:
        frozen = now[head.sandbox_id]
        verdict = eviction(frozen, pools.get(frozen.pool))
        if verdict is not Evict.STOP:
            turn.passed(verdict)
            continue
        turn.stopped()
        stops.append(frozen.sandbox_id)
        now[frozen.sandbox_id] = dataclasses.replace(frozen, suspended=False)
        size = pools[frozen.pool]
        pools[frozen.pool] = dataclasses.replace(size, desired=size.desired - 1, live=size.live - 1)
    return stops
