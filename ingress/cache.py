"""The lease cache: capacity the ingress holds per app, shared by the requests it carries.

Rules (docs/architecture.md, invariants 7-9), each kept in one place below:
- A cached lease of size S carries at most S requests at once: a use is added only while
  uses < S (`pick`).
- An overflow lease carries the one request that took it and goes straight back; it never
  enters the cache (`LeaseCache.acquire`, `LeaseCache.put`).
- Every `Use` is handed back exactly once (`Use.returned`); a lease leaves the cache when it
  has been idle `idle_ttl`, when renew says it is gone, or when its sandbox refused a
  connection. A lease that leaves while uses remain is released when the last one returns.
- `take` and `put` never await, so on one event loop they are atomic; only activator calls
  (acquire, renew, release) await, and they run outside any bookkeeping step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

import anyio

from wakeful.aio.tasks import Background
from wakeful.domain.leases import ActivatorError, LeaseGone, LeaseGrant, Leases
from wakeful.ingress.errors import ActivatorUnreachable

log = logging.getLogger(__name__)

Key = tuple[str, str | None]
"""(app, version): the version the router named (the active one, a split's pick, a tag's);
None only for an app with no version yet."""


@dataclass(eq=False, slots=True)
class CachedLease:
    grant: LeaseGrant
    key: Key
    renewed_at: float
    idle_since: float
    uses: int = 0
    used: bool = False
    """Carried a request since the last renew (the activator records it as activity)."""
    cached: bool = True
    """False once it left the cache: no new uses; released when `uses` reaches 0."""
    gone: bool = False
    """Renew said the activator will not extend it (expired, or its sandbox is leaving):
    no more renewals; it is still released, idempotently, once its last use returns."""

    @property
    def has_room(self) -> bool:
        return self.cached and not self.grant.overflow and self.uses < self.grant.size


@dataclass(eq=False, slots=True)
class Use:
    """One request's share of a lease. `LeaseCache.put` takes it back once, however called."""

    lease: CachedLease
    hit: bool
    returned: bool = False

    @property
    def sandbox_id(self) -> str:
        return self.lease.grant.sandbox_id

    @property
    def url(self) -> str:
        return self.lease.grant.url


@dataclass(frozen=True, slots=True)
class Maintenance:
    renew: list[CachedLease] = field(default_factory=list)
    release: list[CachedLease] = field(default_factory=list)


def pick(entries: Sequence[CachedLease], avoid: Container[str] = ()) -> CachedLease | None:
    """The lease with room and the fewest uses (spreads load); first wins a tie."""
    best: CachedLease | None = None
    fewest = 0
    for entry in entries:
        uses = entry.uses
        # `entry.has_room`, spelled out: this runs for every cached lease on every request
        if not entry.cached or entry.grant.overflow or uses >= entry.grant.size:
            continue
        if (best is None or uses < fewest) and entry.grant.sandbox_id not in avoid:
            best, fewest = entry, uses
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


def kept_under(key: Key, grant: LeaseGrant) -> Key:
    """The key a grant is cached under: the version it is on. An activator whose view the
    ingress is ahead of (or behind) may grant on the active version a lease asked for
    another (`View.resolve`): kept under the asked version, it would carry that version's
    requests to the wrong one for as long as it is renewed (issue 39)."""
    if grant.version and key[1] is not None and grant.version != key[1]:
        return (key[0], grant.version)
    return key


class LeaseCache:
    def __init__(
        self,
        leases: Leases,
        *,
        idle_ttl: float,
        report_every: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_hit: Callable[[str], None] = lambda app: None,
        on_miss: Callable[[str], None] = lambda app: None,
    ) -> None:
        self._leases = leases
        self._idle_ttl = idle_ttl
        self._report_every = report_every
        self._clock = clock
        self._on_hit = on_hit
        self._on_miss = on_miss
        self._entries: dict[Key, list[CachedLease]] = {}
        self._room: dict[Key, list[asyncio.Future[None]]] = {}
        """Requests waiting in `acquire`, per key: told when a cached lease gets room."""
        self._releasing = Background()
        """Leases handed back from a done callback (`release` logs its own failures)."""
        self._closed = False
        self._held: set[CachedLease] = set()
        """Leases out of the cache that still carry requests (an overflow lease, or one whose
        sandbox is leaving): renewed until their last use returns, so none expires mid-request."""

    # -- the request path -------------------------------------------------------------------

    def take(self, key: Key, avoid: Container[str] = ()) -> Use | None:
        """A use of a cached lease with room, or None (then `acquire`). Never awaits."""
        entry = pick(self._entries.get(key, ()), avoid)
        if entry is None:
            return None
        entry.uses += 1
        entry.used = True
        self._on_hit(key[0])
        return Use(entry, hit=True)

    async def acquire(self, key: Key, avoid: Container[str] = ()) -> Use:
        """A use of a fresh lease from the activator (it may wait, bounded, for capacity), or
        of a cached one that gets room first: while the activator makes a request wait (every
        sandbox at its hard limit), a request of this ingress ending frees a use here that the
        activator does not know of, and the waiting request takes it.

        A request that took such room withdraws its ask when the adapter cancels cleanly
        (`Leases.cancels_cleanly`: in-process, the lease channel), so the activator does not
        count it as demand; over plain HTTP, where cancelling could lose a grant the
        activator already counted, the ask is left running. Whatever such an ask is still
        granted goes into the cache, or straight back when it is an overflow lease. One
        cancelled (its client left) is cancelled, as before. Room is announced to one waiter
        at a time; a woken waiter that does not use it, or leaves more, passes the word on."""
        self._on_miss(key[0])
        loop = asyncio.get_running_loop()
        ask = loop.create_task(self._ask(key))
        try:
            while True:
                room = loop.create_future()
                waiting = self._room.setdefault(key, [])
                waiting.append(room)
                took = False
                try:
                    await asyncio.wait([ask, room], return_when=asyncio.FIRST_COMPLETED)
                    if room.done():
                        use = self.take(key, avoid)
                        if use is not None:
                            took = True
                            if self._leases.cancels_cleanly:  # no phantom waiter upstream
                                ask.cancel()
                            self._keep_whatever(key, ask)
                            return use
                    if ask.done():
                        return self._granted(key, ask.result())
                finally:
                    woken = room.done() and not room.cancelled()
                    room.cancel()
                    with contextlib.suppress(ValueError):
                        waiting.remove(room)
                    if not waiting:
                        self._room.pop(key, None)
                    if woken or took:
                        self._pass_room(key)  # room left (or not for this one): the next looks
        except BaseException:
            ask.cancel()
            self._keep_whatever(key, ask)
            raise

    async def _ask(self, key: Key) -> LeaseGrant:
        try:
            return await self._leases.acquire(key[0], key[1])
        except ActivatorError:
            raise
        except Exception as exc:  # the HTTP adapter lets transport errors through
            raise ActivatorUnreachable(f"the activator did not answer: {exc}") from exc

    def _granted(self, key: Key, grant: LeaseGrant) -> Use:
        # No await from the grant to the return: it is recorded before any cancellation can
        # land, so whoever holds the Use will hand it back.
        key = kept_under(key, grant)
        now = self._clock()
        entry = CachedLease(grant, key, renewed_at=now, idle_since=now, uses=1, used=True)
        if grant.overflow:
            entry.cached = False
            self._held.add(entry)
        else:
            self._entries.setdefault(key, []).append(entry)
            if entry.has_room:  # a lease of several: other misses waiting here take it
                self._has_room(key)
        return Use(entry, hit=False)

    def _has_room(self, key: Key) -> None:
        """A cached lease of `key` has room: the first request waiting in `acquire` looks."""
        for room in self._room.get(key, ()):
            if not room.done():
                room.set_result(None)
                return

    def _pass_room(self, key: Key) -> None:
        if pick(self._entries.get(key, ())) is not None:
            self._has_room(key)

    def _keep_whatever(self, key: Key, ask: asyncio.Task[LeaseGrant]) -> None:
        """An ask no request waits for any more: a grant it gets is kept in the cache (or
        released at once when it is an overflow lease, or the cache is closed), never lost."""

        def settle(done: asyncio.Task[LeaseGrant]) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            grant = done.result()
            if grant.overflow or self._closed:
                self._releasing.spawn(self.release(grant))
                return
            now = self._clock()
            key_of = kept_under(key, grant)
            entry = CachedLease(grant, key_of, renewed_at=now, idle_since=now)
            self._entries.setdefault(key_of, []).append(entry)
            self._has_room(key_of)

        ask.add_done_callback(settle)

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
            for entry in [e for e in entries if e.grant.sandbox_id == sandbox_id]:
                self._evict(key, entry)
                if entry.uses == 0:
                    free.append(entry.grant)
        return free

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
        for entry in todo.renew:
            if entry.gone:
                continue
            # A request still running on it is traffic, whether or not a new one started.
            used, entry.used = entry.used or entry.uses > 0, False
            try:
                await self._leases.renew(entry.grant.lease_id, used=used)
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

    async def close(self) -> None:
        """Release every cached lease (at shutdown, after in-flight requests finished)."""
        self._closed = True
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
