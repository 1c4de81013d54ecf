"""A record that lives as long as its holder: bound to a TTL lease the holder keeps alive.

Theory of operation: `run` grants a lease of `ttl` seconds, puts the record under it, and
renews the lease every third of the TTL (at least every 0.5 s) until cancelled. The store
deletes the record a TTL after the last renewal it saw, so a holder that dies (or is cut off)
takes its record with it and nobody has to clean up. A lease the store let expire (the store
was away longer than the TTL) is not fatal: `run` grants a new one and puts the record again,
as it does, a second later, after any other store error (invariant 19: a store outage never
ends a process). `put` rewrites the record under the current lease at once while it is held;
whatever it was given last is what `run` writes under the next lease. `release` revokes the
lease, so the record goes now rather than a TTL later: the holder calls it when it stops, at
the point its shutdown order says (the node agent after its sandboxes have stopped).

Two processes can hold one key (two holders given one name, or a restart while the old process
still runs): the later write wins, under the later lease, and when that process stops its
record goes, though the first still runs and keeps its own lease alive. So after each renewal
the holder reads the key (`_check`): gone, it is written again under the holder's lease;
holding another value (someone else's write, or one this holder cannot read), it is left to
them, and said once.

A holder that must be alone under its key (a node agent: two agents of one node would each
bury the other's sandboxes; an ingress replica: peers relay to it by name) says which records
it may write over (`claimable`: its own previous run's). Each write under a new lease is then
a compare-and-set: over nothing, or over a record it may take, at the revision it read;
another's record ends `run` with `Taken`, having written nothing. Two holders that start
together so cannot both get through; and a lost lease is fatal to such a holder after all
when, meanwhile, another took the key.

Before it writes anything, such a holder waits out a record of its key that is not its own
(`claim`): a previous run's lease runs out within its TTL; a record that stays past the TTL
and `CLAIM_MARGIN` is a running holder's, and the start is refused (the holder's own error,
saying what to do).

The node agent's `nodes/{node}` and an ingress replica's `ingresses/{replica}` are held this
way. A leader's `leaders/{role}` is not: a lost term must never be written again, since
another candidate may have been elected since (`wakeful.store.election`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Generic, TypeVar

import anyio
from pydantic import BaseModel

from .base import Store
from .errors import Conflict, CorruptValue, Forbidden, LeaseNotFound, StoreError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

RETRY = 1.0
"""Seconds between tries while the store fails."""
CLAIM_MARGIN = 3.0
"""Seconds past its TTL a record of the key held by another may stay before it counts as a
running holder's (a previous run's lease runs out within its TTL)."""


class Found(StrEnum):
    """What a holder does with its record as it reads it back after a renewal (`found`)."""

    OURS = "ours"
    REWRITE = "rewrite"
    THEIRS = "theirs"


def found(record: M | None, value: M, stored: M | None) -> Found:
    """`record` as read back (None: gone), against the holder's `value` and what it last
    wrote (`stored`): its own, as it should be; gone, or its own from before a change whose
    write failed: written again; anything else another holder's, left to them (as is a
    record it cannot read, which never gets here)."""
    if record is not None and record == value:
        return Found.OURS
    if record is None or record == stored:
        return Found.REWRITE
    return Found.THEIRS


class Over(StrEnum):
    """How a holder alone under its key writes under a new lease (`over`)."""

    CREATE = "create"
    UPDATE = "update"
    TAKEN = "taken"


def over(record: M | None, stored: M | None, claimable: Callable[[M], bool]) -> Over:
    """Over no record: create it; over one it may take (`claimable`, or its own last write):
    update it at the revision read; over anyone else's: not at all."""
    if record is None:
        return Over.CREATE
    if claimable(record) or record == stored:
        return Over.UPDATE
    return Over.TAKEN


class Taken(Exception):
    """The key holds a record the holder may not write over (`claimable`); `holder` is that
    record, None when it cannot be read (another version's)."""

    def __init__(self, key: str, holder: BaseModel | None) -> None:
        super().__init__(f"{key} is held by another: {holder!r}")
        self.key = key
        self.holder = holder


class HolderRunning(RuntimeError):
    """Another holder of a key that must have one runs (a replica of the same name): the
    start is refused, or the run ended, with a message saying what to do."""


class Claim(StrEnum):
    GO = "go"
    WAIT = "wait"
    REFUSE = "refuse"


def claim_step(holder: str | None, mine: str, waited: float | None, ttl: float) -> Claim:
    """What `claim` does next, given who holds the key's record (None: nobody), this
    holder's identity, and how long the record has been seen held by another (None: not yet
    seen): go when nobody or this holder holds it; wait while a previous run's lease may
    still be running out (its TTL and `CLAIM_MARGIN`); refuse once it has outlived that."""
    if holder is None or holder == mine:
        return Claim.GO
    if waited is not None and waited >= ttl + CLAIM_MARGIN:
        return Claim.REFUSE
    return Claim.WAIT


UNREADABLE = "(a record this version cannot read)"
"""The holder `claim` names for a record another version wrote: someone else's."""


async def claim(
    store: Store,
    key: str,
    model: type[M],
    *,
    identity: Callable[[M], str],
    mine: str,
    ttl: float,
    waiting: Callable[[M | None], None],
    refused: Callable[[M | None], Exception],
    what: str,
    poll: float = 0.5,
) -> None:
    """Before a holder alone under `key` writes anything: a record there whose `identity` is
    not `mine` is a previous run's, whose lease runs out within its TTL, or another holder's,
    still running, which renews it. Waits for it to go (`waiting` is told once, as it starts
    to); raises `refused(record)` once it has stayed for the TTL and `CLAIM_MARGIN`. A record
    it cannot read (another version's; None to the callbacks) is someone else's, as
    `HeldRecord` takes it. A store that fails meanwhile only delays it (invariant 19), and the
    wait starts again after it (a lease can outlive an outage); one that refuses the read
    (`Forbidden`) ends it."""
    seen_at: float | None = None
    while True:
        try:
            item = await store.get(key, model)
            found = None if item is None else item.value
            holder = None if found is None else identity(found)
        except CorruptValue:
            found, holder = None, UNREADABLE
        except Forbidden as exc:  # the piece's etcd role (`wakeful etcd-auth`)
            raise Forbidden(
                f"{what} may not read its record {key}: {exc}; `wakeful etcd-auth` run again "
                "grants each role what this version reads"
            ) from exc
        except StoreError as exc:
            log.warning("%s: cannot read its record yet: %s", what, exc, extra={"key": key})
            seen_at = None  # a lease may outlive an outage: watch it again afterwards
            await anyio.sleep(RETRY)
            continue
        now = anyio.current_time()
        step = claim_step(holder, mine, None if seen_at is None else now - seen_at, ttl)
        if step is Claim.GO:
            return
        if step is Claim.REFUSE:
            raise refused(found)
        if seen_at is None:
            seen_at = now
            waiting(found)
        await anyio.sleep(poll)


class HeldRecord(Generic[M]):
    def __init__(
        self,
        store: Store,
        key: str,
        value: M,
        *,
        ttl: int,
        what: str,
        after_write: Callable[[], Awaitable[None]] | None = None,
        claimable: Callable[[M], bool] | None = None,
    ) -> None:
        """`what` names the holder in logs. `after_write`: run after each write under a new
        lease, before the record counts as held (a `StoreError` from it is retried with the
        write). `claimable`: given, the holder is alone under its key: a write under a new
        lease goes only over no record or one this accepts, else `run` raises `Taken`."""
        self._store = store
        self.key = key
        self.value = value
        self._ttl = ttl
        self._what = what
        self._after_write = after_write
        self._claimable = claimable
        self.lease: int | None = None
        """The lease the record is (or is about to be) written under; None before the first
        grant and after `release`."""
        self.held = anyio.Event()
        """Set once the record was first written (and `after_write` ran)."""
        self._writing = anyio.Lock()
        """Held across a write (and a change of `value`), and across `_check`'s read."""
        self._stored: M | None = None
        """The value this holder last wrote: found in the store while `value` has changed, it
        is this holder's own, from before a write that failed."""
        self._others = False
        """Someone else's write is the record now (said once)."""

    async def run(self) -> None:
        """Write the record and keep it alive until cancelled (see the module's notes)."""
        while True:
            try:
                lease = self.lease = await self._store.grant(self._ttl)
                await self._write(lease)
                if self._after_write is not None:
                    await self._after_write()
                self.held.set()
                while True:
                    await anyio.sleep(max(0.5, self._ttl / 3))
                    await self._store.keep_alive(lease)
                    await self._check(lease)
            except LeaseNotFound:
                log.warning(
                    "%s: its record's lease expired; writing it again",
                    self._what,
                    extra={"key": self.key},
                )
            except StoreError as exc:
                log.warning(
                    "%s: cannot keep its record: %s", self._what, exc, extra={"key": self.key}
                )
                await anyio.sleep(RETRY)

    async def put(self, value: M) -> None:
        """The record is `value` from now on: written at once while it is held (a
        `StoreError` is raised, and the value is still what the next lease gets), else at the
        next write under a lease."""
        async with self._writing:  # `_check` compares the store's copy with the value
            self.value = value
            lease = self.lease
            if lease is not None and self.held.is_set():
                await self._store.put(self.key, value, lease=lease)
                self._stored = value

    async def _write(self, lease: int) -> None:
        async with self._writing:
            value = self.value
            if self._claimable is None:
                await self._store.put(self.key, value, lease=lease)
            else:
                await self._claim(value, lease)
            self._stored = value

    async def _claim(self, value: M, lease: int) -> None:
        """Write `value` under `lease` over no record, or over one that is claimable (or this
        holder's own last write), at the revision read: another writer in between makes it
        look again."""
        assert self._claimable is not None
        while True:
            try:
                item = await self._store.get(self.key, type(value))
            except CorruptValue:
                raise Taken(self.key, None) from None
            step = over(None if item is None else item.value, self._stored, self._claimable)
            if step is Over.TAKEN:
                assert item is not None
                raise Taken(self.key, item.value)
            try:
                if item is None:
                    await self._store.create(self.key, value, lease=lease)
                else:
                    await self._store.update(self.key, value, item.revision, lease=lease)
                return
            except Conflict:
                continue  # written meanwhile: whose is it now?

    async def _check(self, lease: int) -> None:
        """The record as the store has it: gone while the lease lives (another holder of the
        key wrote it under its lease, then stopped), it is written again; another holder's
        write is left alone, also one this holder cannot read (another version's). A store
        that fails here is tried again at the next renewal: the lease lives on."""
        try:
            async with self._writing:
                item = await self._store.get(self.key, type(self.value))
                step = found(None if item is None else item.value, self.value, self._stored)
            if step is Found.OURS:  # (or the same, from a twin: as good)
                self._others = False
                return
            if step is Found.REWRITE:
                if item is None:
                    log.warning(
                        "%s: its record was gone though its lease lives (another process of "
                        "the same name stopped?); writing it again",
                        self._what,
                        extra={"key": self.key},
                    )
                self._others = False
                await self._write(lease)
                return
        except CorruptValue:
            pass  # not a record of ours: someone else's
        except LeaseNotFound:
            raise  # `run` grants a new lease and writes the record under it
        except StoreError as exc:
            log.warning(
                "%s: cannot read its record back: %s", self._what, exc, extra={"key": self.key}
            )
            return
        if not self._others:
            self._others = True
            log.warning(
                "%s: another process wrote its record: two of one name? Its record is theirs "
                "until they stop",
                self._what,
                extra={"key": self.key},
            )

    async def release(self, within: float) -> None:
        """Delete the record now by revoking its lease; best effort, at most `within` seconds,
        not cut short by a cancellation (the TTL deletes it anyway)."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(within),
            contextlib.suppress(StoreError),
        ):
            await self._store.revoke(lease)
