"""Stopping suspended sandboxes for a node's memory cap: the shell of
`suspend_decisions.EvictionTurn` (which one to stop, when to stop walking, why).

A node past its cap for suspended memory says how much to give up (`Node.evict_bytes`) and
lists its frozen sandboxes, the longest suspended first (`Node.evict`). Each tick, for each
node, the turn is started from the view; each sandbox it names is decided from the view as
it is then (a write before may have changed it), and one to stop is stopped with its pool
shrunk by one in one transaction (both compare-and-set), so the pool controller does not
replace it. A write that loses a race ends the node's turn; the next tick decides again from
fresh records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container

from wakeful.activator.ledger import LeaseLedger
from wakeful.activator.metrics import ActivatorMetrics
from wakeful.activator.suspend_decisions import (
    Evict,
    EvictionTurn,
    Listed,
    PoolSize,
    eviction,
)
from wakeful.activator.view import View
from wakeful.domain.lifecycle import Transition, transition
from wakeful.domain.models import STARTING, SandboxStatus, ScaleChange
from wakeful.store import Conflict, Item, Put, Require, Store

log = logging.getLogger(__name__)


class Evictor:
    def __init__(
        self,
        store: Store,
        view: View,
        ledger: LeaseLedger,
        metrics: ActivatorMetrics,
        *,
        thawing: Container[str],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`thawing`: the sandboxes whose thaw is being written (`Suspender`'s)."""
        self._store = store
        self._view = view
        self._ledger = ledger
        self._metrics = metrics
        self._thawing = thawing
        self._wall_clock = wall_clock

    async def evict(self) -> list[str]:
        """Give up what nodes ask of their suspended memory. Returns those stopped."""
        stopped: list[str] = []
        for node, record in sorted(self._view.nodes.items()):
            listed = [self._listed(f.sandbox, f.weight, node) for f in record.value.evict]
            turn = EvictionTurn.start(record.value.evict_bytes, listed, self._pool_sizes(listed))
            while (head := turn.next()) is not None:
                fresh = self._listed(head.sandbox_id, head.weight, node)
                verdict = eviction(fresh, self._pool_size(fresh.pool))
                if verdict is not Evict.STOP:
                    turn.passed(verdict)
                elif await self._stop(head.sandbox_id):
                    turn.stopped()
                    stopped.append(head.sandbox_id)
                else:
                    turn.raced()
        return stopped

    def _listed(self, sandbox_id: str, weight: int, node: str) -> Listed:
        """One sandbox `node` lists, as the view has it now."""
        item = self._view.sandboxes.get(sandbox_id)
        sandbox = None if item is None else item.value
        return Listed(
            sandbox_id,
            weight=weight,
            pool="" if sandbox is None else sandbox.pool,
            on_node=sandbox is not None and sandbox.node == node,
            suspended=sandbox is not None and sandbox.status is SandboxStatus.SUSPENDED,
            thawing=sandbox_id in self._thawing,
            leased=self._ledger.leased_on(sandbox_id),
        )

    def _pool_sizes(self, listed: list[Listed]) -> dict[str, PoolSize]:
        """The pools of the listed sandboxes that the view has."""
        found = {}
        for name in {f.pool for f in listed}:
            size = self._pool_size(name)
            if size is not None:
                found[name] = size
        return found

    def _pool_size(self, name: str) -> PoolSize | None:
        state = self._view.pools.get(name)
        if state is None:
            return None
        pool = state.item.value
        return PoolSize(
            retired=pool.retired,
            desired=pool.desired_instances,
            min_instances=pool.min_instances,
            live=self._view.live(state),
            starting=any(self._view.sandboxes[s].value.status in STARTING for s in state.sandboxes),
        )

    async def _stop(self, sandbox_id: str) -> bool:
        """Stop one suspended sandbox with its pool shrunk by one, in one transaction;
        False when the write lost a race."""
        item = self._view.sandboxes[sandbox_id]
        sandbox = item.value
        pool_item = self._view.pools[sandbox.pool].item
        pool = pool_item.value
        target = pool.desired_instances - 1
        change = ScaleChange(
            at=self._wall_clock(),
            by="memory",
            from_instances=pool.desired_instances,
            to_instances=target,
            reason=f"memory: node {sandbox.node} holds too much for suspended sandboxes; "
            f"stopped {sandbox.id}, suspended the longest",
        )
        smaller = pool.model_copy(update={"desired_instances": target, "last_scale": change})
        stopping = sandbox.model_copy(
            update={
                "status": transition(sandbox.status, Transition.STOP),
                "ready": False,
                "last_log": "stopped while suspended: its node's memory cap for suspended "
                "sandboxes was passed",
            }
        )
        try:
            revision = await self._store.txn(
                [Require(pool_item.key, pool_item.revision), Require(item.key, item.revision)],
                [Put(pool_item.key, smaller), Put(item.key, stopping)],
            )
        except Conflict:
            return False
        self._metrics.evictions.labels(pool=pool.name).inc()
        log.info(
            "stopped a suspended sandbox for memory",
            extra={"sandbox": sandbox.id, "pool": pool.name},
        )
        self._view.apply_pool(Item(pool_item.key, smaller, revision))
        self._view.apply_sandbox(Item(item.key, stopping, revision))
        return True
