"""The lease cache: capacity the ingress holds per app, shared by the requests it carries.

Rules (docs/architecture.md, invariants 7-9 and 27), each kept in one place (the records and
pure rules in `cacherules.py`):
- A cached lease of size S carries at most S requests at once: a use is added only while
  uses < S (`pick`).
- An overflow lease carries the one request that took it and goes straight back; it never
  enters the cache (`LeaseCache.acquire`, `LeaseCache.put`).
- Every `Use` is handed back exactly once (`Use.returned`); a lease leaves the cache when it
  has been idle `idle_ttl`, when renew says it is gone, or when its sandbox refused a
  connection; and sooner, carrying no request, when a renewal says its pool is short
  (`spares`). A lease that leaves while uses remain is released when the last one returns.
- `take` and `put` never await, so on one event loop they are atomic; only activator calls
  (acquire, renew, release) await, and they run outside any bookkeeping step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container

import anyio

from wakeful.aio.tasks import Background
from wakeful.domain.leases import (
    MAX_ASK_REQUESTS,
    ActivatorError,
    LeaseGone,
    LeaseGrant,
    Leases,
    Riders,
    short,
)
from wakeful.ingress.cacherules import (
    Ask,
    CachedLease,
    Key,
    Use,
    gives_back,
    heard_short,
    kept_under,
    pick,
    plan,
    spares,
)
from wakeful.ingress.errors import ActivatorUnreachable

log = logging.getLogger(__name__)

FIRST_SEATS = MAX_ASK_REQUESTS
"""Misses riding one ask of a key whose lease size is not known yet (`LeaseCache._learn`):
all of them, so a first burst takes one lease and learns its size; those it cannot carry
ask again, knowing it. (With 16, a burst of 100 took seven leases of 200 at once and kept
them all alive, spreading its uses, while another worker got an overflow lease per
request: bench/workers.py's bursts.)"""
MAX_SIZES_KEPT = 100_000
"""Lease sizes remembered per key (`LeaseCache._learn`) before the memory is cleared."""


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()


class LeaseCache:
    def __init__(
        self,
        leases: Leases,
        *,
        idle_ttl: float,
        report_every: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_miss: Callable[[str], None] = lambda app: None,
    ) -> None:
        self._leases = leases
        self._idle_ttl = idle_ttl
        self._report_every = report_every
        self._clock = clock
        self._on_miss = on_miss
        self._entries: dict[Key, list[CachedLease]] = {}
        self._open: dict[Key, Ask] = {}
        """The ask of each key still taking riders (sent at the end of this loop turn)."""
        self._sizes: dict[Key, int] = {}
        """The size of each key's last lease: how many misses ride one ask (`_learn`)."""
        self._overflowed: dict[Key, float] = {}
        """When a request of each key here last got an overflow lease (`gives_back`)."""
        self._room: dict[Key, list[asyncio.Future[None]]] = {}
        """Requests waiting in `acquire`, per key: told when a cached lease gets room."""
        self._releasing = Background()
        """Leases handed back from a done callback (`release` logs its own failures)."""
        self._closed = False
        self._told: dict[tuple[str, str], float] = {}  # (app, version): when told short
        self._held: set[CachedLease] = set()
        """Leases out of the cache that still carry requests (an overflow lease, or one whose
        sandbox is leaving): renewed until their last use returns, so none expires mid-request."""
        self._unheed = leases.heed_short(self._told_short)

    # -- the request path -------------------------------------------------------------------

    def take(self, key: Key, avoid: Container[str] = ()) -> Use | None:
        """A use of a cached lease with room, or None (then `acquire`). Never awaits."""
        entries = self._entries.get(key)
        entry = pick(entries, avoid) if entries else None
        if entry is None:
            return None
        entry.uses += 1
        entry.used = True
        return Use(entry, hit=True)  # counted by the proxy, which has the app's counts at hand

    async def acquire(self, key: Key, avoid: Container[str] = ()) -> Use:
        """A use of a lease from the activator (it may wait, bounded, for capacity), shared
        with the other misses of `key` that wait with this one, or of a cached lease that
        gets room first.

        Misses share asks (`Ask`): a miss rides the ask of its key that is out, or opens
        one; at most as many as the key's last lease carried ride one, so one grant carries
        them all. The activator counts a parked ask as the requests riding it, told as they
        join and leave (`Riders`; over plain HTTP only those riding when it was sent), so
        its demand stays a slot per waiting request (seed 000). A rider the grant cannot
        carry (an overflow lease carries one) asks again. So a burst of misses takes the
        leases it needs, not one lease each: with several ingresses, one does not take
        every normal lease of a pool and leave the others an overflow lease per request.

        While the activator makes an ask wait (every sandbox at its hard limit), a request of
        this ingress ending frees a use here that the activator does not know of, and a
        waiting request takes it. An ask no rider waits for any more is withdrawn when the
        adapter cancels cleanly (`Leases.cancels_cleanly`: in-process, the lease channel), so
        the activator does not count it as demand; over plain HTTP, where cancelling could
        lose a grant the activator already counted, it is left running. Whatever such an
        ask is still granted goes into the cache, or straight back when it is an overflow
        lease. Room is announced to one waiter at a time; a woken waiter that does not use
        it, or leaves more, passes the word on."""
        self._on_miss(key[0])
        loop = asyncio.get_running_loop()
        while True:
            ask = self._join(key, loop)
            use = await self._ride(key, ask, avoid, loop)
            if use is not None:
                return use

    def _join(self, key: Key, loop: asyncio.AbstractEventLoop) -> Ask:
        """A seat on the ask of `key` still taking riders, or on a new one."""
        ask = self._open.get(key)
        if ask is None or ask.seats <= 0 or ask.done.done():
            seats = min(self._sizes.get(key, FIRST_SEATS), MAX_ASK_REQUESTS)  # the wire's bound
            ask = Ask(loop.create_future(), seats)
            self._open[key] = ask
            # It goes when the task first runs, the next turn of the loop: the misses of
            # this turn ride it from the start, and it says how many they are then.
            ask.task = loop.create_task(self._ask(key, ask.riders))
            ask.task.add_done_callback(lambda task: self._settle(key, ask))
        ask.seats -= 1
        ask.waiting += 1
        ask.riders.change(1)  # the activator hears of it, once the ask is out
        if ask.seats <= 0 and self._open.get(key) is ask:
            del self._open[key]  # full: the next miss opens another
        return ask

    async def _ride(
        self, key: Key, ask: Ask, avoid: Container[str], loop: asyncio.AbstractEventLoop
    ) -> Use | None:
        """Wait for the ask's grant or for room on a cached lease; None: ask again."""
        try:
            while True:
                room = loop.create_future()
                waiting = self._room.setdefault(key, [])
                waiting.append(room)
                took = False
                try:
                    await asyncio.wait([ask.done, room], return_when=asyncio.FIRST_COMPLETED)
                    if ask.done.done():
                        if ask.done.cancelled():
                            return None
                        ask.done.result()  # the ask's refusal, for each of its riders
                        use = self._claim(ask) or self.take(key, avoid)
                        took = use is not None
                        return use
                    if room.done():
                        use = self.take(key, avoid)
                        if use is not None:
                            took = True
                            return use
                finally:
                    woken = room.done() and not room.cancelled()
                    room.cancel()
                    with contextlib.suppress(ValueError):
                        waiting.remove(room)
                    if not waiting:
                        self._room.pop(key, None)
                    if woken or took:
                        self._pass_room(key)  # room left (or not for this one): the next looks
        finally:
            ask.waiting -= 1
            if not ask.done.done():
                ask.seats += 1  # its seat is free for the next miss
                ask.riders.change(-1)
                if ask.waiting == 0:
                    self._abandon(key, ask)
            elif ask.waiting == 0 and self._for_one(ask.entry):
                entry, ask.entry = ask.entry, None  # an overflow lease none of them took
                assert entry is not None
                self._releasing.spawn(self.release(entry.grant))

    async def _ask(self, key: Key, riders: Riders) -> LeaseGrant:
        try:
            return await self._leases.acquire(key[0], key[1], riders=riders)
        except ActivatorError:
            raise
        except Exception as exc:  # the HTTP adapter lets transport errors through
            raise ActivatorUnreachable(f"the activator did not answer: {exc}") from exc

    def _settle(self, key: Key, ask: Ask) -> None:
        """The ask ended: a grant goes into the cache for its riders (or is held for one of
        them when it is an overflow lease; released when none is left), never lost."""
        if self._open.get(key) is ask:
            del self._open[key]
        task = ask.task
        failed = None if task.cancelled() else task.exception()
        if task.cancelled() or (failed is not None and ask.waiting == 0):
            ask.done.cancel()  # nobody to tell
            return
        if failed is not None:
            ask.done.set_exception(failed)
            # Its riders read it; one cancelled in this same turn never will.
            ask.done.add_done_callback(_retrieved)
            return
        grant = task.result()
        self._learn(key, grant)
        now = self._clock()
        entry = CachedLease(grant, kept_under(key, grant), renewed_at=now, idle_since=now)
        if grant.overflow or self._closed:
            entry.cached, entry.for_one = False, True  # one request, then it goes back
            if ask.waiting == 0:
                self._releasing.spawn(self.release(grant))
            else:
                ask.entry = entry  # for the first rider that looks
        else:
            self._entries.setdefault(entry.key, []).append(entry)
            ask.entry = entry
            self._has_room(entry.key)
        ask.done.set_result(None)

    def _learn(self, key: Key, grant: LeaseGrant) -> None:
        """How many misses may ride one ask of `key` from now: what its last lease carries
        (1 after an overflow lease: the pool is full, each request needs its own)."""
        if len(self._sizes) >= MAX_SIZES_KEPT:
            self._sizes.clear()
            self._overflowed.clear()
        self._sizes[key] = 1 if grant.overflow else grant.size
        if grant.overflow:  # the pool may be short because of this ingress (`gives_back`)
            self._overflowed[key] = self._clock()
            ask = self._open.pop(key, None)  # which may bring one too: no more riders
            if ask is not None:
                ask.seats = 0

    def _claim(self, ask: Ask) -> Use | None:
        """A use of the lease the rider's own ask brought, while it has room."""
        entry = ask.entry
        if entry is None:
            return None
        if self._for_one(entry):
            ask.entry = None  # kept out of the cache: it carries one request
            entry.uses, entry.used = 1, True
            self._held.add(entry)
            return Use(entry, hit=False)
        if not entry.cached or entry.uses >= entry.size:
            return None  # left the cache (its sandbox went), or full
        entry.uses += 1
        entry.used = True
        return Use(entry, hit=False)

    @staticmethod
    def _for_one(entry: CachedLease | None) -> bool:
        """A granted lease kept out of the cache for one rider, not taken yet (one that went
        into the cache is never that, even once `close` or an eviction took it out)."""
        return entry is not None and entry.for_one and not entry.uses

    def _abandon(self, key: Key, ask: Ask) -> None:
        """No rider waits on `ask` any more (it is not answered yet): withdraw it where that
        loses nothing; whatever it is still granted is settled (`_settle`)."""
        if self._open.get(key) is ask:
            del self._open[key]
        if self._leases.cancels_cleanly:
            ask.task.cancel()  # no phantom waiter upstream; a grant that crossed is settled

    def _has_room(self, key: Key) -> None:
        """A cached lease of `key` has room: the first request waiting in `acquire` looks."""
        for room in self._room.get(key, ()):
            if not room.done():
                room.set_result(None)
                return

    def _pass_room(self, key: Key) -> None:
        entries = self._entries.get(key)
        if entries and pick(entries) is not None:
            self._has_room(key)

    def put(self, use: Use) -> LeaseGrant | None:
        """Take a use back; returns a lease the caller must release now, if any."""
        if use.returned:
            return None
        use.returned = True
        entry = use.lease
        entry.uses -= 1
        entry.used = True  # it carried a request until now: the next renewal says so
        if entry.uses == 0:
            entry.idle_since = self._clock()
            self._held.discard(entry)
            if not entry.cached:
                return entry.grant
        if entry.has_room and entry.key in self._room:
            self._has_room(entry.key)
        return None

    def drop_sandbox(self, sandbox_id: str) -> list[LeaseGrant]:
        """Take every lease on a sandbox out of the cache; returns those free to release now."""
        free = []
        for key, entries in list(self._entries.items()):
            for entry in [e for e in entries if e.sandbox_id == sandbox_id]:
                self._evict(key, entry)
                if entry.uses == 0:
                    free.append(entry.grant)
        return free

    def release_soon(self, grant: LeaseGrant) -> None:  # `close` waits for it
        self._releasing.spawn(self.release(grant))

    async def release(self, grant: LeaseGrant) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._leases.release(grant.lease_id)
            except Exception as exc:  # the activator expires it by TTL; nothing else to do
                log.warning("could not release lease: %s", exc, extra={"lease": grant.lease_id})

    # -- background -------------------------------------------------------------------------

    async def run(self, interval: float) -> None:
        """Renew held leases and hand back idle ones, until cancelled."""
        while True:
            await anyio.sleep(interval)
            await self.maintain()

    async def maintain(self) -> None:
        entries = [e for group in self._entries.values() for e in group]
        entries += [e for e in self._held if not e.gone]
        todo = plan(entries, self._clock(), self._idle_ttl, self._report_every)
        for entry in todo.release:
            if entry.uses == 0 and entry.cached:  # a request may have taken it meanwhile
                self._evict(entry.key, entry)
                await self.release(entry.grant)
        now = self._clock()
        self._told = {pool: at for pool, at in self._told.items() if short(at, now)}
        short_now = heard_short(entries, self._told, now)
        """Keys and versions whose pool is short: told so lately, or saying so as they renew
        (`LeaseGrant.spare_wanted`)."""
        for entry in todo.renew:
            if entry.gone:
                continue
            # A request still running on it is traffic, whether or not a new one started.
            used, entry.used = entry.used or entry.uses > 0, False
            try:
                renewed = await self._leases.renew(entry.grant.lease_id, used=used)
                if renewed.spare_wanted:
                    short_now.add((entry.key, entry.grant.version))
            except LeaseGone:
                # Expired, or its sandbox is leaving admission: no new request may use it.
                # While requests still run on it, keep renewing (the activator extends a
                # draining sandbox's lease for them); it goes back when the last one ends.
                log.info("lease gone; dropping it", extra={"lease": entry.grant.lease_id})
                was_cached = entry.cached
                self._evict(entry.key, entry)
                if entry.uses == 0:
                    entry.gone = True
                    if was_cached:
                        await self.release(entry.grant)  # a draining sandbox waits for it
                entry.renewed_at = self._clock()
                continue
            except Exception as exc:  # try again next tick; past its TTL it reads LeaseGone
                entry.used = entry.used or used
                log.warning("renew failed: %s", exc, extra={"lease": entry.grant.lease_id})
                continue
            entry.renewed_at = self._clock()
        now = self._clock()
        for key, version in short_now:
            if gives_back(self._overflowed.get(key), key in self._room, now):
                await self._give_back_spares(key, version)

    def _told_short(self, app: str, version: str) -> None:
        """The activator says the pool of `app`'s `version` turned short (`Leases.heed_short`):
        the spare leases on it here go back now, as at a renewal that says so, not when this
        ingress, quiet, next renews them (a third of their TTL apart); and those that become
        spares within `SHORT_SECONDS` at a `maintain` (the news comes once a spell)."""
        if self._closed:
            return
        now = self._told[(app, version)] = self._clock()
        for key in list(self._entries):
            if key[0] == app and gives_back(self._overflowed.get(key), key in self._room, now):
                self._releasing.spawn(self._give_back_spares(key, version))

    async def _give_back_spares(self, key: Key, version: str) -> None:
        """The activator wants the normal leases of a pool this ingress does not use
        (`spares`; those of `key` on `version`): they go back now, not after the idle TTL."""
        on = [entry for entry in self._entries.get(key, ()) if entry.grant.version == version]
        spare = spares(on, self._clock())
        if spare:
            log.info(
                "handing back %d unused lease(s): the pool is short",
                len(spare),
                extra={"app": key[0]},
            )
        for entry in spare:
            # Asked again: while a release was out a request may have taken it, or taken it
            # and ended (then it carried one a moment ago, and is no spare).
            if spares((entry,), self._clock()):
                self._evict(key, entry)
                await self.release(entry.grant)

    async def close(self) -> None:
        """Release every cached lease (at shutdown, after in-flight requests finished)."""
        self._closed = True
        self._unheed()
        await self._releasing.wait()  # hand-backs under way reach the activator first
        entries = [e for group in self._entries.values() for e in group]
        self._entries.clear()
        for entry in entries:
            entry.cached = False
            if entry.uses == 0:
                await self.release(entry.grant)

    def _evict(self, key: Key, entry: CachedLease) -> None:
        entry.cached = False
        if entry.uses > 0:
            self._held.add(entry)
        group = self._entries.get(key)
        if group is not None and entry in group:
            group.remove(entry)
            if not group:
                del self._entries[key]

    def snapshot(self) -> list[CachedLease]:
        """Every cached lease (tests and the admin view read it)."""
        return [e for group in self._entries.values() for e in group]

    def held(self) -> list[CachedLease]:
        """Every lease out of the cache that still carries requests (tests read it)."""
        return [e for e in self._held if not e.gone]
