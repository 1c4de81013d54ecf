"""The control plane's side of a stateful app's state: the archives nodes store and the
releases they make (invariant 21; design/stateful-apps-and-evacuation.md).

A node never writes `states/` itself: it stores the archive of a state it holds here and
releases (or keeps) the state through here, so the one check that matters is made by the
control plane, against the record: the node asking holds `states/{app}` at the epoch it names.
What a node could do with a write of its own (point another app's state at an archive of its
choosing) it cannot do through here.

Theory of operation:
- **An upload** (`store_archive`) names (node, app, epoch). It is refused (`NotHeld`) unless
  `states/{app}` is held by that node at that epoch: a token named after no node, or a node
  that holds nothing of the app, stores nothing. A state is only ever adopted for a node the
  pool controller placed a sandbox on, so this check includes "the node is registered".
- **Pending bytes are bounded.** What a node stored and has not released yet (the archive no
  record names) counts against that node and against the whole control plane, until it is
  released with it or the collector's grace has passed (then the collector deletes it, as it
  does any unreferenced blob). An upload counts from when it is admitted (its declared size,
  else the bound), so uploads at once cannot all pass the check before any is counted. Past
  either bound an upload is refused (`StorageFull`, 507 with Retry-After): the node keeps its
  archive and tries again (`StateHold.settle`). Counted in memory, per control plane: a new
  leader starts from zero, which the grace bounds anyway.
- **An upload never keeps another file.** Storing bytes already stored does not start their
  grace again (an artifact's upload does): a node can fetch any digest, and would otherwise
  keep a deleted app's files from ever being collected.
- **A release or a keep** is decided by `wakeful.domain.state` on the record as read, and
  written by compare-and-set on its revision (and, when the node asks, on its sandbox's record
  at the revision it read: `settle` hands back only for a sandbox that did not start since).
  A release names an archive only once it is stored.

`StateKeeper.for_node` binds a node's name: what an in-process node agent uses (`wakeful up`);
a node elsewhere calls the same through the control API (`deploy/states_api.py`,
`wakeful.remote.HttpKeeper`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.domain import keys, state
from wakeful.domain.artifacts import ArtifactError, ArtifactUnavailable
from wakeful.domain.models import AppState
from wakeful.store import Conflict, Put, Require, Store

REFUSALS = ("not_held", "node_full", "total_full")
"""The `reason` label of `wakeful_deploy_state_uploads_refused_total`."""


class NotHeld(ArtifactError):
    """The uploading node does not hold the app's state at that epoch: refused for good (409)."""


class StorageFull(ArtifactUnavailable):
    """Past a bound on archives stored and not yet released: try again later (507)."""

    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class ArchiveMissing(ArtifactError):
    """A release names an archive the blob store does not have: nothing written (400)."""


@dataclass(frozen=True)
class Bounds:
    per_node: int
    """Bytes one node may have stored and not released."""
    total: int
    """Bytes all nodes together may have stored and not released."""


def upload_refusal(node_pending: int, total_pending: int, size: int, bounds: Bounds) -> str | None:
    """Which bound an upload of `size` bytes would pass (a `REFUSALS` reason), or None.

    An upload that fits when nothing is pending is never refused by that bound alone: a bound
    smaller than one archive would refuse it for ever (the settings refuse such bounds too)."""
    if node_pending and node_pending + size > bounds.per_node:
        return "node_full"
    if total_pending and total_pending + size > bounds.total:
        return "total_full"
    return None


@dataclass(frozen=True)
class Ticket:
    """An admitted upload, counted as pending until it is stored or cancelled."""

    node: str
    size: int
    number: int


@dataclass
class Pending:
    """Archives stored and not yet released, and uploads admitted and not yet stored, per
    node, on one clock. Synchronous."""

    grace: float
    by_node: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict)
    """node -> digest -> (bytes, stored at)."""
    admitted: dict[int, Ticket] = field(default_factory=dict)
    counter: int = 0

    def admit(self, node: str, size: int) -> Ticket:
        self.counter += 1
        ticket = Ticket(node, size, self.counter)
        self.admitted[ticket.number] = ticket
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        self.admitted.pop(ticket.number, None)

    def _forget_old(self, now: float) -> None:
        for node, stored in list(self.by_node.items()):
            for digest, (_, at) in list(stored.items()):
                if now - at > self.grace:  # the collector deletes it: it counts no more
                    del stored[digest]
            if not stored:
                del self.by_node[node]

    def sizes(self, node: str, now: float) -> tuple[int, int]:
        """(bytes pending for `node`, bytes pending in all)."""
        self._forget_old(now)
        mine = sum(size for size, _ in self.by_node.get(node, {}).values())
        total = sum(size for stored in self.by_node.values() for size, _ in stored.values())
        for ticket in self.admitted.values():
            total += ticket.size
            mine += ticket.size if ticket.node == node else 0
        return mine, total

    def add(self, node: str, digest: str, size: int, now: float) -> None:
        self.by_node.setdefault(node, {})[digest] = (size, now)

    def released(self, node: str, digest: str) -> None:
        stored = self.by_node.get(node, {})
        stored.pop(digest, None)
        if not stored:
            self.by_node.pop(node, None)


class StateKeeper:
    def __init__(
        self,
        store: Store,
        artifacts: LocalArtifacts,
        bounds: Bounds | None = None,
        *,
        grace: float = 600.0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`grace`: the artifact collector's (an unreleased archive stops counting when the
        collector may delete it). `clock`: the blob store's wall clock."""
        self._store = store
        self._artifacts = artifacts
        limit = artifacts.state_max_bytes
        self.bounds = bounds or Bounds(per_node=4 * limit, total=16 * limit)
        self._pending = Pending(grace)
        self._clock = clock
        registry = registry or CollectorRegistry()
        self.refused = Counter(
            "wakeful_deploy_state_uploads_refused_total",
            "State archive uploads refused, by reason: the node did not hold the state "
            "(not_held), or archives stored and not yet released passed the node's or the "
            "whole control plane's bound",
            ["reason"],
            registry=registry,
        )
        for reason in REFUSALS:
            self.refused.labels(reason)
        Gauge(
            "wakeful_deploy_state_pending_bytes",
            "Bytes of state archives stored and not yet released",
            registry=registry,
        ).set_function(lambda: self._pending.sizes("", self._clock())[1])

    def for_node(self, node: str) -> NodeKeeper:
        return NodeKeeper(self, node)

    # -- uploads --------------------------------------------------------------------------------

    async def admit(self, node: str, app: str, epoch: int, size: int) -> Ticket:
        """Whether `node` may store an archive of up to `size` bytes of `app`'s state held at
        `epoch`: `NotHeld` or `StorageFull` when not; else a ticket that counts `size` as
        pending until `store_archive` stores it or `cancel` drops it. Made before a body is
        read."""
        found = await self._store.get(keys.state(app), AppState)
        if found is None or found.value.node != node or found.value.epoch != epoch:
            self.refused.labels("not_held").inc()
            where = "nobody" if found is None else f"{state.holder(found.value)}"
            at = "" if found is None else f" at epoch {found.value.epoch}"
            raise NotHeld(
                f"node {node} does not hold the state of app {app!r} at epoch {epoch} "
                f"(held by {where}{at}): only its holder stores its archive"
            )
        mine, total = self._pending.sizes(node, self._clock())
        refusal = upload_refusal(mine, total, size, self.bounds)
        if refusal is not None:
            self.refused.labels(refusal).inc()
            bound, pending = (
                (self.bounds.per_node, mine)
                if refusal == "node_full"
                else (self.bounds.total, total)
            )
            whose = f"node {node}" if refusal == "node_full" else "all nodes"
            raise StorageFull(
                refusal,
                f"{whose} stored {pending} bytes of state archives not yet released; the bound "
                f"is {bound}: try again once they are released",
                retry_after=30,
            )
        return self._pending.admit(node, size)

    def cancel(self, ticket: Ticket) -> None:
        """An admitted upload that will store nothing (more): it counts no more. Idempotent."""
        self._pending.cancel(ticket)

    async def store_archive(
        self,
        node: str,
        app: str,
        epoch: int,
        data: bytes,
        digest: str,
        ticket: Ticket | None = None,
    ) -> None:
        """Store the archive of `app`'s state that `node` holds at `epoch`, admitted as
        `ticket` (admitted now when None). `NotHeld`, `StorageFull`; `ArtifactError` for an
        archive that is not one (or over the bound)."""
        if ticket is None:
            ticket = await self.admit(node, app, epoch, len(data))
        try:
            limit = self._artifacts.state_max_bytes
            stored = await self._artifacts.put(data, expected=digest, limit=limit, refresh=False)
            self._pending.add(node, stored, len(data), self._clock())
        finally:
            self._pending.cancel(ticket)

    # -- releases -------------------------------------------------------------------------------

    async def release(
        self,
        node: str,
        app: str,
        epoch: int,
        *,
        archive: str | None = None,
        size: int = 0,
        error: str = "",
        sandbox_at: tuple[str, int] | None = None,
    ) -> AppState | state.Stale | None:
        """Hand the state `node` holds at `epoch` back, with the `archive` it stored (None:
        nothing newer than the record's own). What was written; the refusal (`Stale`, nothing
        written); None when the record is gone or the sandbox moved on (`sandbox_at`: its id
        and the revision it was read at, 0 for absent). `ArchiveMissing` when `archive` is
        not stored."""
        if archive is not None and not self._artifacts.has(archive):
            raise ArchiveMissing(f"archive {archive} is not stored: store it first")
        now = self._clock()
        written = await self._change(
            app,
            lambda record: state.release(
                record, node, epoch, now, archive=archive, size=size, error=error
            ),
            sandbox_at,
        )
        if isinstance(written, AppState) and archive is not None:
            self._pending.released(node, archive)
        return written

    async def keep(
        self, node: str, app: str, epoch: int, error: str, *, for_good: bool = True
    ) -> AppState | state.Stale | None:
        """The state stays with `node` at `epoch`, with why: `for_good`, until an operator
        acts; else until the node manages to hand it back."""
        return await self._change(
            app, lambda record: state.keep(record, node, epoch, error, kept=for_good)
        )

    async def _change(
        self,
        app: str,
        decide: Callable[[AppState], AppState | state.Stale],
        sandbox_at: tuple[str, int] | None = None,
    ) -> AppState | state.Stale | None:
        """Write what `decide` makes of the record, by compare-and-set on its revision (and on
        the sandbox's, when given: a conflict there gives up). Decided again from the fresh
        record after a conflict on the state's own."""
        key = keys.state(app)
        also = [] if sandbox_at is None else [Require(keys.sandbox(sandbox_at[0]), sandbox_at[1])]
        while True:
            item = await self._store.get(key, AppState)
            if item is None:
                return None  # the app was deleted
            decided = decide(item.value)
            if isinstance(decided, state.Stale):
                return decided
            try:
                await self._store.txn([Require(key, item.revision), *also], [Put(key, decided)])
            except Conflict:
                if also:
                    return None
                continue
            return decided


@dataclass(frozen=True)
class NodeKeeper:
    """A `StateKeeper` for one node: the node agent's `Keeper` in the control plane's process."""

    keeper: StateKeeper
    node: str

    async def store(self, app: str, epoch: int, data: bytes, digest: str) -> None:
        await self.keeper.store_archive(self.node, app, epoch, data, digest)

    async def release(
        self,
        app: str,
        epoch: int,
        *,
        archive: str | None = None,
        size: int = 0,
        error: str = "",
        sandbox_at: tuple[str, int] | None = None,
    ) -> AppState | state.Stale | None:
        return await self.keeper.release(
            self.node, app, epoch, archive=archive, size=size, error=error, sandbox_at=sandbox_at
        )

    async def keep(
        self, app: str, epoch: int, error: str, *, for_good: bool = True
    ) -> AppState | state.Stale | None:
        return await self.keeper.keep(self.node, app, epoch, error, for_good=for_good)
