"""The pool controller's shell: each tick, read pools, sandboxes and nodes, plan, act.

Every write is a compare-and-set on the record it was planned from; a conflict just means
another writer moved first, and the next tick plans again from fresh state. Lease counts come
from the activator (`leased_on`), which runs in the same process as the controller.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import anyio

from wakeful.domain import keys, trace
from wakeful.domain.lifecycle import Transition, can, transition
from wakeful.domain.models import Cordon, Node, Pool, Sandbox, SandboxStatus
from wakeful.store import Conflict, Item, Store, StoreError
from wakeful.store.reflector import Feed, reflect_all

from .plan import Create, Drain, MarkDead, Remove, Stop, cooldown, crashed, plan_pool

log = logging.getLogger(__name__)


def with_cordon(node: Node, cordon: Cordon | None) -> Node:
    if cordon is None:
        return node
    return node.model_copy(update={"cordoned": True, "evacuating": cordon.evacuate})


class ChangeSignal:
    """A reflector view that keeps nothing: any listing or change sets `changed`. The controller
    re-reads what it plans from on every tick, so it only needs to know that something moved."""

    def __init__(self) -> None:
        self.changed = anyio.Event()

    def replace(self, items: list[Item[Any]], revision: int) -> None:
        self.changed.set()

    def put(self, item: Item[Any]) -> None:
        self.changed.set()

    def delete(self, key: str, revision: int) -> None:
        self.changed.set()


class Reconciler:
    def __init__(
        self,
        store: Store,
        leased_on: Callable[[str], int],
        *,
        interval: float = 1.0,
        drain_grace: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._leased_on = leased_on
        self._interval = interval
        self._clock = clock
        self._trust_leases_after = clock() + drain_grace
        """Lease counts live in the activator's memory: right after it (re)starts they read 0
        although ingresses still hold leases they will renew. Until one lease TTL has passed,
        a draining sandbox is assumed busy, so a restart cuts no request short."""

    async def run(self) -> None:
        """Reconcile on every change to pools, sandboxes, nodes or cordons, and every interval
        anyway (lease releases that unblock a drain are not store changes)."""
        signal = ChangeSignal()
        feeds: list[Feed[Any]] = [
            Feed(keys.POOLS, Pool, signal),
            Feed(keys.SANDBOXES, Sandbox, signal),
            Feed(keys.NODES, Node, signal),
            Feed(keys.CORDONS, Cordon, signal),
        ]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: reflect_all(self._store, feeds, what="pool controller"))
            while True:
                signal.changed = anyio.Event()
                try:
                    await self.tick()
                except StoreError as exc:
                    log.warning("pool controller could not reconcile: %s", exc)
                with anyio.move_on_after(self._interval):
                    await signal.changed.wait()

    async def tick(self) -> None:
        pools = {p.value.name: p for p in (await self._store.list(keys.POOLS, Pool)).items}
        sandboxes = (await self._store.list(keys.SANDBOXES, Sandbox)).items
        cordons = {
            c.value.node: c.value for c in (await self._store.list(keys.CORDONS, Cordon)).items
        }
        nodes = [
            with_cordon(n.value, cordons.get(n.value.name))
            for n in (await self._store.list(keys.NODES, Node)).items
        ]
        now = self._clock()
        by_pool: dict[str, list[Item[Sandbox]]] = defaultdict(list)
        placed: dict[str, int] = defaultdict(int)
        for item in sandboxes:
            by_pool[item.value.pool].append(item)
            if item.value.node and item.value.status not in (
                SandboxStatus.STOPPED,
                SandboxStatus.DEAD,
            ):
                placed[item.value.node] += 1
        for name in sorted(set(pools) | set(by_pool)):
            pool_item = pools.get(name)
            items = {i.value.id: i for i in by_pool.get(name, [])}
            if pool_item is not None:
                pool_item = await self._track_crashes(pool_item, list(items.values()), now)
            leased = {sandbox_id: self._leased_on(sandbox_id) for sandbox_id in items}
            if now < self._trust_leases_after:
                leased = {sandbox_id: max(count, 1) for sandbox_id, count in leased.items()}
            actions = plan_pool(
                pool_item.value if pool_item else None,
                [i.value for i in items.values()],
                leased,
                nodes,
                placed,
                now,
            )
            for action in actions:
                await self._act(action, pool_item, items, now)

    async def _track_crashes(
        self, pool_item: Item[Pool], items: list[Item[Sandbox]], now: float
    ) -> Item[Pool]:
        """Count crashes before their records are removed; a routable sandbox ends a streak."""
        pool = pool_item.value
        crashes = [i.value for i in items if crashed(i.value)]
        if crashes:
            count = pool.crash_count + len(crashes)
            updated = pool.model_copy(
                update={
                    "crash_count": count,
                    "crash_cooldown_until": now + cooldown(count),
                    "last_crash_log": crashes[-1].last_log[-4000:],
                }
            )
            log.warning(
                "app %s failed to boot (%d in a row): %s",
                pool.app,
                count,
                crashes[-1].last_log[-500:],
                extra={"pool": pool.name},
            )
        elif pool.crash_count and any(i.value.routable for i in items):
            updated = pool.model_copy(update={"crash_count": 0, "crash_cooldown_until": 0.0})
        else:
            return pool_item
        revision = await self._store.update(pool_item.key, updated, pool_item.revision)
        return Item(pool_item.key, updated, revision)

    async def _act(
        self,
        action: Create | Drain | Stop | Remove | MarkDead,
        pool_item: Item[Pool] | None,
        items: dict[str, Item[Sandbox]],
        now: float,
    ) -> None:
        try:
            if isinstance(action, Create):
                assert pool_item is not None
                pool = pool_item.value
                sandbox_id = f"{pool.name}-{uuid.uuid4().hex[:8]}"
                record = Sandbox(
                    id=sandbox_id,
                    pool=pool.name,
                    app=pool.app,
                    node=action.node,
                    owner=action.node,
                    epoch=1,
                    created_at=now,
                )
                await self._store.create(keys.sandbox(sandbox_id), record)
                log.info("placed %s on %s", sandbox_id, action.node, extra={"pool": pool.name})
                trace.mark("placed", pool.app)
            elif isinstance(action, Remove):
                await self._store.delete(
                    keys.sandbox(action.sandbox_id), items[action.sandbox_id].revision
                )
            else:
                item = items[action.sandbox_id]
                event = {
                    Drain: Transition.DRAIN,
                    Stop: Transition.STOP,
                    MarkDead: Transition.FAIL,
                }[type(action)]
                if not can(item.value.status, event):
                    # The plan is made from the same record: this is a planner bug, not a race.
                    log.error(
                        "refusing to %s a %s sandbox",
                        event.value,
                        item.value.status.value,
                        extra={"sandbox": action.sandbox_id},
                    )
                    return
                status = transition(item.value.status, event)
                update: dict[str, object] = {"status": status, "ready": False}
                if isinstance(action, MarkDead):
                    # The owner is gone: release ownership in the same write, at a new epoch,
                    # so a node that comes back cannot write over what replaced it.
                    update.update(last_log=action.reason, owner=None, epoch=item.value.epoch + 1)
                await self._store.update(
                    item.key, item.value.model_copy(update=update), item.revision
                )
        except Conflict:
            pass  # another writer moved first; the next tick plans from fresh state
