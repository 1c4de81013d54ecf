"""Leader election on the store's TTL leases, and writes fenced by the term they were made in.

Theory of operation:
- A candidate holds a role (`leaders/{role}`) by creating its key under a TTL lease of its
  own. The key's revision at creation identifies the term: it only grows, and no two terms
  share it. Whoever finds the key present waits (`retry` seconds between looks) until it is
  gone: released by `resign`, or expired with its holder's lease.
- The holder keeps its lease alive (`Term` is held by `hold`) and gives the term up by itself
  when it cannot: its lease is gone, its key changed, or no keep-alive succeeded for half the
  TTL. The store expires the lease only a full TTL after the last keep-alive it saw, so a
  holder cut off from the store stops acting (it has half a TTL to notice) before another can
  be elected.
- Every write the holder makes goes through `FencedStore`, which adds one requirement to it:
  the key is still at the term's revision. A deposed holder whose write was already on its
  way (a stalled process, a network pause longer than the TTL) finds the requirement failed and
  writes nothing (`Deposed`): the store itself is the judge, not the holder's clock.
- `lead(work)` is the one leadership loop: campaign, run `work` with the term while `hold`
  keeps it, cancel `work` when the term is over and campaign again; told to stop, resign at
  once, while `work` stops, so another candidate leads without waiting for its shutdown.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import anyio

from wakeful.domain.models import Leader

from .base import RawOp, Require, StoreBase, WatchItem
from .errors import AlreadyExists, Conflict, Deposed, LeaseNotFound, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Term:
    key: str
    revision: int
    """The key's revision when this term began: the fence."""
    lease: int


class Election:
    def __init__(
        self,
        store: StoreBase,
        key: str,
        leader: Leader,
        *,
        ttl: int = 5,
        retry: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`ttl`: seconds the store keeps the key after the holder's last keep-alive (a
        takeover after a crash takes about this long); `retry`: seconds between looks at a
        held key."""
        if ttl < 2:
            raise ValueError(f"an election's ttl must be at least 2 seconds, got {ttl}")
        self._store = store
        self.key = key
        self.leader = leader
        self._ttl = ttl
        self._retry = retry
        self._clock = clock
        self._valid_until = -math.inf
        """On `clock`: until when the term held is certainly current (half a TTL after the
        last renewal that began before it succeeded)."""

    def leading(self) -> bool:
        """The term held is certainly still current: checked before each grant, so a
        process paused past its term grants nothing when it wakes, before `hold` notices."""
        return self._clock() < self._valid_until

    async def current(self) -> Leader | None:
        item = await self._store.get(self.key, Leader)
        return None if item is None else item.value

    async def campaign(self, previous: Term | None = None) -> Term:
        """Wait until this candidate holds the key; a store error is waited out, not raised.

        `previous`: a term this candidate gave up (`hold` raised `Deposed` because the store
        was away). While its key is still there at the same revision nobody else was elected
        since, so once its lease can be renewed again it is taken up again at once, instead
        of waiting a TTL for it to expire (after an etcd restart, which keeps leases)."""
        announced = False
        while True:
            try:
                held = await self._store.get(self.key, Leader)
                if (
                    previous is not None
                    and held is not None
                    and held.revision == previous.revision
                    and await self._renewed(previous)
                ):
                    log.info("resumed the term", extra={"key": self.key})
                    self._valid_until = self._clock() + self._ttl / 2
                    return previous
                if held is None:
                    asked = self._clock()
                    lease = await self._store.grant(self._ttl)
                    try:
                        revision = await self._store.create(self.key, self.leader, lease=lease)
                    except AlreadyExists:
                        await self._store.revoke(lease)
                    else:
                        log.info("elected", extra={"key": self.key, "revision": revision})
                        self._valid_until = asked + self._ttl / 2
                        return Term(self.key, revision, lease)
                elif not announced:
                    announced = True
                    log.info(
                        "standing by: %s holds %s",
                        held.value.holder,
                        self.key,
                        extra={"leader_url": held.value.url},
                    )
            except StoreError as exc:
                log.warning("campaign: the store failed, retrying: %s", exc)
            await anyio.sleep(self._retry)

    async def _renewed(self, term: Term) -> bool:
        try:
            await self._store.keep_alive(term.lease)
        except LeaseNotFound:
            return False
        return True

    async def hold(self, term: Term) -> None:
        """Keep the term alive; raises `Deposed` once it is over (see the module's notes),
        at the latest half a TTL after the last renewal: no attempt and no pause between
        attempts runs past that. Never returns otherwise: cancel it to stop, then `resign`."""
        interval = max(0.2, self._ttl / 5)
        while True:
            sent = self._clock()
            left = self._valid_until - sent
            try:
                with anyio.fail_after(max(0.0, min(interval, left))):
                    await self._store.keep_alive(term.lease)
                    item = await self._store.get(self.key, Leader)
            except LeaseNotFound:
                self._valid_until = -math.inf
                raise Deposed(f"the lease of {self.key!r} expired: the term is over") from None
            except (StoreError, TimeoutError) as exc:
                log.warning("could not renew %s: %s", self.key, exc)
            else:
                if item is None or item.revision != term.revision:
                    self._valid_until = -math.inf
                    raise Deposed(f"{self.key!r} changed hands: the term is over")
                self._valid_until = sent + self._ttl / 2
            left = self._valid_until - self._clock()
            if left <= 0:
                raise Deposed(
                    f"no renewal of {self.key!r} for {self._ttl / 2:g} s: giving the term up "
                    "before the store can elect another holder"
                )
            await anyio.sleep(min(interval, left))

    async def resign(self, term: Term) -> None:
        """End the term now (the lease and its key go), so another candidate takes over at
        once instead of after the TTL; `leading()` is false from the first moment. Best
        effort: the TTL ends it anyway."""
        self._valid_until = -math.inf
        try:
            with anyio.fail_after(5):
                await self._store.revoke(term.lease)
        except (StoreError, TimeoutError) as exc:
            log.warning("could not resign %s: %s (it expires with its TTL)", self.key, exc)

    async def lead(
        self,
        work: Callable[[Term], Awaitable[object]],
        *,
        campaign: Callable[[Term | None], Awaitable[Term]] | None = None,
    ) -> NoReturn:
        """Lead whenever elected, until cancelled: campaign, then run `work(term)` while
        `hold` keeps the term. Once the term is over (`Deposed`) `work` is cancelled and the
        candidate campaigns again, offering the term it lost (taken up again at once if nobody
        else was elected meanwhile). A `work` that returns is campaigned after the same way,
        its term kept, not resigned. Cancelled, it resigns at once, while `work` is being
        cancelled: another candidate leads without waiting for `work`'s shutdown. An error
        from `work` is raised, the term resigned. `campaign(previous)`: how to wait for a term
        (default: `self.campaign`), for a candidate that serves something meanwhile."""
        wait_for_term = campaign or self.campaign
        term: Term | None = None
        while True:
            term = await wait_for_term(term)
            resigned = False
            try:
                async with anyio.create_task_group() as leading:
                    leading.start_soon(self._keep, term, leading.cancel_scope)
                    leading.start_soon(self._work, work, term, leading.cancel_scope)
                    try:
                        await anyio.sleep_forever()
                    finally:
                        if not leading.cancel_scope.cancel_called:  # told to stop
                            with anyio.CancelScope(shield=True):
                                await self.resign(term)
                            resigned = True
            except BaseException:
                if not resigned:
                    with anyio.CancelScope(shield=True):
                        await self.resign(term)
                raise

    async def _keep(self, term: Term, leading: anyio.CancelScope) -> None:
        try:
            await self.hold(term)
        except Deposed as exc:
            log.error("stopped leading: %s; standing by again", exc, extra={"key": self.key})
            leading.cancel()

    @staticmethod
    async def _work(
        work: Callable[[Term], Awaitable[object]], term: Term, leading: anyio.CancelScope
    ) -> None:
        await work(term)
        leading.cancel()


class FencedStore(StoreBase):
    """`inner`, with every write required to happen while `term` is current (`Deposed` when
    it is not: nothing written). Reads, watches and leases pass through."""

    def __init__(self, inner: StoreBase, term: Term) -> None:
        self._inner = inner
        self.term = term
        self._fence = Require(term.key, term.revision)

    async def _get(self, key: str) -> tuple[bytes, int] | None:
        return await self._inner._get(key)

    async def _list(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        return await self._inner._list(prefix)

    async def _commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        try:
            return await self._inner._commit([self._fence, *require], ops)
        except Conflict as exc:
            if exc.key == self._fence.key:  # the backend names the first check that failed
                raise Deposed(
                    f"a write after the term of {self._fence.key!r} at revision "
                    f"{self._fence.revision} ended; nothing was written"
                ) from None
            raise

    def _watch(self, prefix: str, from_revision: int | None) -> AsyncIterator[WatchItem]:
        return self._inner._watch(prefix, from_revision)

    async def grant(self, ttl: int) -> int:
        return await self._inner.grant(ttl)

    async def keep_alive(self, lease: int) -> None:
        await self._inner.keep_alive(lease)

    async def revoke(self, lease: int) -> None:
        await self._inner.revoke(lease)

    async def compact(self, revision: int) -> None:
        await self._inner.compact(revision)

    async def aclose(self) -> None:
        """The inner store belongs to whoever opened it."""
