"""Every write the node agent makes to a sandbox record: fenced, then compare-and-set.

The shell around `fencing.decide`: read the record, ask whether this node may apply the
lifecycle event and with what ownership, write by compare-and-set on the record's revision,
and on a conflict decide again from the fresh record (the activator's activity writes and the
pool controller's drains are never overwritten). It remembers the epoch each sandbox was
started at, which is what the writes are fenced on, and the record as it last read or wrote
it: the next write decides from that and is tried on its revision, so a sandbox's start (claim,
booting, ready) reads the store once. A record changed since fails the compare-and-set and is
read again, exactly as a stale read would; a refusal is only ever decided from a fresh read.
"""

from __future__ import annotations

import logging

from wakeful.domain import keys
from wakeful.domain.lifecycle import Transition
from wakeful.domain.models import Sandbox
from wakeful.store import Conflict, Item, Store

from .fencing import Refusal, Refuse, decide

log = logging.getLogger(__name__)
MAX_CONFLICTS = 20


class SandboxWriter:
    def __init__(self, store: Store, node: str) -> None:
        self._store = store
        self._node = node
        self._epochs: dict[str, int] = {}
        """The ownership epoch each sandbox was started at; writes are fenced on it."""
        self._known: dict[str, Item[Sandbox]] = {}
        """Each sandbox's record as this writer last read or wrote it."""

    def started(self, sandbox_id: str, epoch: int, record: Item[Sandbox] | None = None) -> None:
        """Writes for `sandbox_id` are fenced on `epoch` from now on; `record`: as just read."""
        self._epochs[sandbox_id] = epoch
        if record is not None:
            self._known[sandbox_id] = record

    def forget(self, sandbox_id: str) -> None:
        self._epochs.pop(sandbox_id, None)
        self._known.pop(sandbox_id, None)

    async def change(self, sandbox_id: str, event: Transition, **fields: object) -> bool:
        """Apply a lifecycle event by compare-and-set; False when it no longer applies.

        Fenced (invariant 15): only while this node owns the record at the epoch it started
        the sandbox at. Once ownership was released or moved (the epoch went up), every
        write of ours is refused, even one the lifecycle table would allow.
        """
        key = keys.sandbox(sandbox_id)
        for _ in range(MAX_CONFLICTS):
            known = self._known.pop(sandbox_id, None)
            item = known or await self._store.get(key, Sandbox)
            if item is None:
                return False
            decision = decide(item.value, self._node, self._epochs.get(sandbox_id), event)
            if isinstance(decision, Refuse) and known is not None:
                continue  # refused by what it last saw: the record may have moved since
            if isinstance(decision, Refuse):
                level = logging.INFO if decision.why is Refusal.ILLEGAL else logging.WARNING
                log.log(
                    level,
                    "not writing %s: %s",
                    event.value,
                    decision.reason,
                    extra={"sandbox": sandbox_id},
                )
                return False
            value = decision.applied_to(item.value, fields)
            try:
                revision = await self._store.update(key, value, expect_revision=item.revision)
            except Conflict:
                continue
            if sandbox_id in self._epochs:  # not forgotten meanwhile
                self._known[sandbox_id] = Item(key, value, revision)
            return True
        return False
