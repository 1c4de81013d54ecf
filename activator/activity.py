"""Recording traffic as each sandbox's `last_activity`, which the idle monitor reads.

Theory of operation: a lease grant, a release and a renewal that reports use `touch` a sandbox
with the wall-clock time (the idle monitor, on another machine perhaps, compares it with its
own wall clock). `flush` writes the newest touch of each sandbox by compare-and-set, at most
once per interval per sandbox (timed on the activator's monotonic clock), and often enough that
a busy sandbox never looks idle: a third of its pool's `scale_down_delay`. A conflict leaves
the touch for the next round (the watch brings the newer record).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import anyio

from wakeful.activator.view import View
from wakeful.store import Conflict, Item, Store, StoreError

log = logging.getLogger(__name__)

FLUSH_EVERY = 0.5
"""Seconds between two flushes while the activator runs."""


class ActivityWriter:
    def __init__(
        self, store: Store, view: View, *, interval: float, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._view = view
        self._interval = interval
        self._clock = clock
        self._touched: dict[str, float] = {}
        """Sandbox id to the wall-clock time of its latest traffic not yet written."""
        self._written_at: dict[str, float] = {}
        """Sandbox id to when (on `clock`) its last_activity was last written."""

    def touch(self, sandbox_id: str, when: float) -> None:
        self._touched[sandbox_id] = when

    def latest(self, sandbox_id: str) -> float:
        """The newest traffic of the sandbox not yet written (0 when none)."""
        return self._touched.get(sandbox_id, 0.0)

    def forget(self, sandbox_id: str) -> None:
        self._touched.pop(sandbox_id, None)
        self._written_at.pop(sandbox_id, None)

    async def run(self) -> None:
        while True:
            await anyio.sleep(FLUSH_EVERY)
            await self.flush()

    async def flush(self) -> int:
        """Write last_activity for sandboxes that carried leases, at most once an interval each."""
        now = self._clock()
        written = 0
        for sandbox_id, when in list(self._touched.items()):
            item = self._view.sandboxes.get(sandbox_id)
            if item is None or item.value.last_activity >= when:
                self._touched.pop(sandbox_id, None)
                continue
            last = self._written_at.get(sandbox_id, -math.inf)
            if now - last < self._write_interval(item.value.pool):
                continue
            touched = item.value.model_copy(update={"last_activity": when})
            try:
                revision = await self._store.update(
                    item.key, touched, expect_revision=item.revision
                )
            except Conflict:
                continue  # the watch brings the newer record; try again next round
            except StoreError as exc:
                log.warning("could not record activity: %s", exc, extra={"sandbox": sandbox_id})
                return written
            self._view.apply_sandbox(Item(item.key, touched, revision))
            self._written_at[sandbox_id] = now
            if self._touched.get(sandbox_id) == when:
                del self._touched[sandbox_id]
            written += 1
        return written

    def _write_interval(self, pool: str) -> float:
        state = self._view.pools.get(pool)
        delay = state.item.value.spec.concurrency.scale_down_delay if state else math.inf
        return min(self._interval, delay / 3)
