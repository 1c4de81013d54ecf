"""The lease cache's records and its pure rules (docs/architecture.md, invariants 7-9): what a
cached lease, a request's use of it and a shared ask of the activator are, which lease carries
a request (`pick`), which leases are renewed or handed back (`plan`, `spares`, `gives_back`,
`heard_short`), and the key a grant is kept under (`kept_under`). `LeaseCache`
(`ingress/cache.py`) carries them out."""

from __future__ import annotations

import asyncio
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

from wakeful.domain.leases import LeaseGrant, Riders, short

Key = tuple[str, str | None]
"""(app, version): the version the router named (the active one, a split's pick, a tag's);
None only for an app with no version yet."""


@dataclass(eq=False, slots=True)
class Ask:
    """One ask of the activator, shared by the misses of a key that wait together (its
    riders): sent when its task first runs (the turn after it was opened), saying how many
    ride it, and taking more until it is answered, at most `seats` in all (what the key's last
    lease carried), the activator told of each (`Riders`)."""

    done: asyncio.Future[None]
    """Set once the ask ended: granted (`entry`), refused (its error), or withdrawn."""
    seats: int
    riders: Riders = field(default_factory=lambda: Riders(0))
    """As the activator is told: the riders waiting, until the ask is answered."""
    waiting: int = 0
    """Riders still in `LeaseCache._ride`, answered or not."""
    task: asyncio.Task[LeaseGrant] = field(init=False)
    entry: CachedLease | None = None
    """What it was granted, for its riders: a cached lease, or an overflow one for one."""


@dataclass(eq=False, slots=True, init=False)
class CachedLease:
    grant: LeaseGrant
    key: Key
    renewed_at: float
    idle_since: float
    sandbox_id: str
    url: str
    size: int
    overflow: bool
    h2c: bool
    server_timing: bool
    log: tuple[bool, bool]
    """The grant's, which every request reads: copied once, as an attribute of the grant (a
    pydantic model) costs a lookup through its `__getattr__` hook each time."""
    uses: int = 0
    used: bool = False
    """Carried a request since the last renew (the activator records it as activity)."""
    cached: bool = True
    """False once it left the cache: no new uses; released when `uses` reaches 0."""
    gone: bool = False
    """Renew said the activator will not extend it (expired, or its sandbox is leaving):
    no more renewals; it is still released, idempotently, once its last use returns."""
    for_one: bool = False
    """Granted to a shared ask and kept out of the cache for one of its riders (an overflow
    lease, or any lease once the cache closed): decided when it came, never after."""

    def __init__(  # written out: compiled, where a dataclass's own would be interpreted
        self,
        grant: LeaseGrant,
        key: Key,
        renewed_at: float,
        idle_since: float,
        uses: int = 0,
        used: bool = False,
        cached: bool = True,
        gone: bool = False,
        for_one: bool = False,
    ) -> None:
        self.grant = grant
        self.key = key
        self.renewed_at = renewed_at
        self.idle_since = idle_since
        self.uses = uses
        self.used = used
        self.cached = cached
        self.gone = gone
        self.for_one = for_one
        self.sandbox_id = grant.sandbox_id
        self.url = grant.url
        self.size = grant.size
        self.overflow = grant.overflow
        self.h2c = grant.protocol == "h2c"
        self.server_timing = grant.server_timing
        self.log = (grant.access_log, grant.access_log_query)

    @property
    def has_room(self) -> bool:
        return self.cached and not self.overflow and self.uses < self.size


@dataclass(eq=False, slots=True, init=False)
class Use:
    """One request's share of a lease. `LeaseCache.put` takes it back once, however called."""

    lease: CachedLease
    hit: bool
    returned: bool = False

    def __init__(self, lease: CachedLease, hit: bool, returned: bool = False) -> None:
        # written out: compiled, where a dataclass's own would be interpreted
        self.lease = lease
        self.hit = hit
        self.returned = returned

    @property
    def sandbox_id(self) -> str:
        return self.lease.sandbox_id


SPARE_QUIET = 1.0
"""Seconds a cached lease must have carried no request to be handed back as spare (`spares`)."""


@dataclass(frozen=True, slots=True)
class Maintenance:
    renew: list[CachedLease] = field(default_factory=list)
    release: list[CachedLease] = field(default_factory=list)


def pick(entries: list[CachedLease], avoid: Container[str] = ()) -> CachedLease | None:
    """The lease a request takes: one with room on the sandbox carrying the fewest of this
    ingress's requests (spreads load over sandboxes); on that sandbox, the busiest lease with
    room (packs its leases, so one the load no longer needs goes idle and is handed back
    instead of being kept alive by a share of every request: another ingress can then have
    it). First wins a tie."""
    if len(entries) == 1:  # most apps: one lease
        only = entries[0]
        if only.has_room and only.sandbox_id not in avoid:
            return only
        return None
    loads: dict[str, int] = {}
    """Uses per sandbox, counted once (not once per lease with room)."""
    for entry in entries:
        sandbox = entry.sandbox_id
        loads[sandbox] = loads.get(sandbox, 0) + entry.uses
    best: CachedLease | None = None
    best_load = best_uses = 0
    for entry in entries:
        uses = entry.uses
        # `entry.has_room`, spelled out: this runs for every cached lease on every request
        if not entry.cached or entry.overflow or uses >= entry.size:
            continue
        sandbox = entry.sandbox_id
        if sandbox in avoid:
            continue
        load = loads[sandbox]
        if best is None or load < best_load or (load == best_load and uses > best_uses):
            best, best_load, best_uses = entry, load, uses
    return best


def plan(
    entries: Sequence[CachedLease], now: float, idle_ttl: float, report_every: float = 5.0
) -> Maintenance:
    """Which cached leases to hand back (idle long enough) and which to renew.

    A lease is renewed once a third of its TTL has passed, so two renewals can fail before
    the activator expires it; and sooner, every `report_every` seconds, when it carried
    traffic: the renewal tells the activator the sandbox is in use, so the idle monitor never
    scales down a sandbox whose requests all go through a cached lease.
    """
    out = Maintenance()
    for entry in entries:
        since = now - entry.renewed_at
        if entry.uses == 0 and now - entry.idle_since >= idle_ttl:
            out.release.append(entry)
        elif since >= entry.grant.ttl_seconds / 3 or (
            (entry.used or entry.uses > 0) and since >= report_every
        ):
            out.renew.append(entry)
    return out


def spares(entries: Sequence[CachedLease], now: float) -> list[CachedLease]:
    """The leases of a key handed back when the activator says their pool is short
    (`LeaseGrant.spare_wanted`: a request of it, from this ingress or another, got less than a
    normal lease): cached, carrying no request, and none for `SPARE_QUIET` seconds (a lease
    between two requests of a steady load stays). Without it they would wait out the idle
    TTL while another ingress's requests take an overflow lease each."""
    return [e for e in entries if e.cached and not e.uses and now - e.idle_since >= SPARE_QUIET]


def heard_short(
    entries: Sequence[CachedLease], told: Mapping[tuple[str, str], float], now: float
) -> set[tuple[Key, str]]:
    """The keys and versions of `entries` whose pool the activator said turned short
    (`told`: when, by app and version; `Leases.heed_short`) within `SHORT_SECONDS`: the news
    comes once a spell, and a lease in use when it came may be a spare since."""
    return {
        (e.key, e.grant.version)
        for e in entries
        if short(told.get((e.key[0], e.grant.version)), now)
    }


def gives_back(overflowed_at: float | None, waiting: bool, now: float) -> bool:
    """Whether an ingress told a pool is short (`LeaseGrant.spare_wanted`) hands its spare
    leases of it back: not while the shortness may be its own, when a request of the key here
    got an overflow lease within `SHORT_SECONDS` (`overflowed_at`) or requests of it wait here
    now. The activator does not say whose request was short; an ingress alone would
    otherwise hand back, after each of its bursts past the pool's capacity, the leases its
    next burst needs (and a sandbox whose leases all went back is suspended sooner)."""
    return not waiting and not short(overflowed_at, now)


def kept_under(key: Key, grant: LeaseGrant) -> Key:
    """The key a grant is cached under: the version it is on. An activator whose view the
    ingress is ahead of (or behind) may grant on the active version a lease asked for
    another (`View.resolve`): kept under the asked version, it would carry that version's
    requests to the wrong one for as long as it is renewed (issue 39)."""
    if grant.version and key[1] is not None and grant.version != key[1]:
        return (key[0], grant.version)
    return key
