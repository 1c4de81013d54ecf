"""The node's record: `nodes/{node}`, bound to a TTL lease the agent keeps alive, so that it
is gone when the agent is (the pool controller then treats the node's sandboxes as dead), and
`seen/{node}`, written the first time the node registers (no TTL).

Two writers change the record, the suspended tier's report and the tunnel's coverage table;
one at a time, so no older copy lands after a newer one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Node, SeenNode, Tunnel
from wakeful.store import Conflict, Store
from wakeful.store.held import HeldRecord

from .settings import NodeSettings


class Registration:
    def __init__(
        self,
        store: Store,
        settings: NodeSettings,
        isolation: str,
        clock: Callable[[], float],
    ) -> None:
        """`isolation`: how this node isolates sandboxes, as `wakeful status` shows it."""
        self._store = store
        self._name = settings.node_name
        self._clock = clock
        self._lock = anyio.Lock()
        self._record = Node(
            name=settings.node_name,
            address=settings.node_address,
            capacity=settings.capacity,
            isolation=isolation,
            tunnel=Tunnel() if settings.tunnel else None,
        )
        self._held = HeldRecord(
            store,
            keys.node(settings.node_name),
            self._record,
            ttl=settings.node_ttl,
            what=f"node {settings.node_name}",
            after_write=self._seen,
        )

    @property
    def held(self) -> anyio.Event:
        """Set once the record was first written (and `seen/{node}` was)."""
        return self._held.held

    async def run(self) -> None:
        """Write the record and keep it alive until cancelled (`HeldRecord.run`)."""
        await self._held.run()

    async def release(self, within: float) -> None:
        """Delete the record now, not a TTL later (the agent stops)."""
        await self._held.release(within)

    async def _seen(self) -> None:
        with contextlib.suppress(Conflict):  # present from an earlier registration
            await self._store.create(
                keys.seen(self._name), SeenNode(name=self._name, first_seen=self._clock())
            )

    async def update(self, fields: Mapping[str, object]) -> None:
        """Rewrite the record with `fields` changed, if that changes it. Kept only once
        written: a write that failed (`StoreError`) is tried again by the next call."""
        async with self._lock:
            record = self._record.model_copy(update=dict(fields))
            if record != self._record:
                await self._held.put(record)
                self._record = record

    async def publish_tunnel(self, table: Tunnel) -> None:
        """Rewrite the record with the tunnel's coverage table (kept even when the write
        fails: the next write, or the next lease, carries it)."""
        async with self._lock:
            self._record = self._record.model_copy(update={"tunnel": table})
            await self._held.put(self._record)
