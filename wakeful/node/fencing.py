"""Ownership fencing (invariant 15, design/drain-and-ownership-fencing.md), as a pure decision.

The one rule: this node writes a sandbox record only while it owns it at the epoch it started
the sandbox at. Ownership moves only by compare-and-set on (owner, epoch), and the pool
controller is the one that moves it: once it released a record (owner cleared, epoch raised)
every write of the old owner is refused, even one the lifecycle table would allow. A record
placed here that was never owned (no owner, epoch 0: written before ownership existed, or by a
tool that does not set it) is adopted at epoch 1 with the first write; a released record has a
later epoch and is never adopted.

No I/O here. `SandboxWriter` (`node.writer`) reads the record, asks `decide`, and writes what
it answers by compare-and-set on the record's revision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from wakeful.domain.lifecycle import IllegalTransition, Transition, transition
from wakeful.domain.models import Sandbox, SandboxStatus


class Refusal(StrEnum):
    NOT_OURS = "not ours"
    """Owned by another node, or released (owner cleared, epoch raised)."""
    STALE_EPOCH = "stale epoch"
    """Ours, but at another epoch than the one this run started the sandbox at."""
    ILLEGAL = "illegal"
    """Ours, but the lifecycle table has no such move from the record's status."""


@dataclass(frozen=True)
class Write:
    """Write the record at `status`, owned by `owner` at `epoch` (`adopted`: newly so)."""

    status: SandboxStatus
    owner: str
    epoch: int
    adopted: bool = False

    def applied_to(self, record: Sandbox, fields: dict[str, object]) -> Sandbox:
        """The record as written: status, ownership, the caller's fields; a sandbox that is
        not running is never ready."""
        update = {"status": self.status, "owner": self.owner, "epoch": self.epoch, **fields}
        if self.status is not SandboxStatus.RUNNING:
            update["ready"] = False
        return record.model_copy(update=update)


@dataclass(frozen=True)
class Refuse:
    why: Refusal
    reason: str


def unowned(record: Sandbox, node: str) -> bool:
    """Placed on `node` and never owned: the node adopts it with its first write."""
    return record.owner is None and record.epoch == 0 and record.node == node


def claims(record: Sandbox, node: str) -> bool:
    """`node` owns the record, or will adopt it."""
    return record.owner == node or unowned(record, node)


def start_epoch(record: Sandbox, node: str) -> int | None:
    """The epoch `node` runs the record's sandbox at, None when it is not the node's to run."""
    return max(record.epoch, 1) if claims(record, node) else None


def decide(record: Sandbox, node: str, started_at: int | None, event: Transition) -> Write | Refuse:
    """May `node` apply `event` to `record`, and with what ownership?

    `started_at` is the epoch this run of the node started the sandbox at; None when it did
    not start it (what a previous run left behind), and then the record's own epoch counts.
    """
    adopt = unowned(record, node)
    if not adopt:
        if record.owner != node:
            holder = "nobody (released)" if record.owner is None else record.owner
            return Refuse(
                Refusal.NOT_OURS, f"the sandbox is owned by {holder} at epoch {record.epoch} now"
            )
        if started_at is not None and record.epoch != started_at:
            return Refuse(
                Refusal.STALE_EPOCH,
                f"the sandbox is ours at epoch {record.epoch} now, not at {started_at}",
            )
    try:
        status = transition(record.status, event)
    except IllegalTransition as exc:
        return Refuse(Refusal.ILLEGAL, str(exc))
    if adopt:
        return Write(status, owner=node, epoch=1, adopted=True)
    return Write(status, owner=node, epoch=record.epoch)
