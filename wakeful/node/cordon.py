"""The cordon an agent puts on its own node while it stops, and lifts when it is back.

A stopping agent cordons its node once, before its first sandbox drains: a replacement placed
here meanwhile would never start. The write is bounded, so a store that is down does not keep
the process running. The cordon is marked `by_agent`; the next run lifts only such a one, so
an operator's cordon (`wakeful drain`) outlives the agent's restart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Cordon
from wakeful.store import Conflict, Store, StoreError

WRITE_BOUND = 5.0
"""Seconds a stopping agent waits for its cordon to be written before it goes on without."""


class OwnCordon:
    def __init__(self, store: Store, node: str, clock: Callable[[], float]) -> None:
        self._store = store
        self._node = node
        self._clock = clock
        self._lock = anyio.Lock()
        self._done = False

    async def once(self) -> None:
        """Cordon the node, the first time only (every sandbox that drains asks first)."""
        async with self._lock:
            if self._done:
                return
            self._done = True
            with anyio.move_on_after(WRITE_BOUND), contextlib.suppress(StoreError):
                await self._put()

    async def _put(self) -> None:
        key = keys.cordon(self._node)
        if await self._store.get(key, Cordon) is None:
            cordon = Cordon(node=self._node, evacuate=False, since=self._clock(), by_agent=True)
            with contextlib.suppress(Conflict):
                await self._store.create(key, cordon)

    async def lift(self) -> None:
        """Delete the cordon a previous run of this agent left (an operator's stays)."""
        found = await self._store.get(keys.cordon(self._node), Cordon)
        if found is not None and found.value.by_agent:
            with contextlib.suppress(Conflict):
                await self._store.delete(found.key, expect_revision=found.revision)
