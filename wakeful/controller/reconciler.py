"""The pool controller's shell: each tick, take pools, sandboxes, nodes and cordons, plan, act.

Every write is a compare-and-set on the record it was planned from; a conflict just means
another writer moved first, and the next tick plans again from fresh state. Running, it plans
from a mirror of the store kept by one watch (each record decoded once, when it changes: a tick
that listed and decoded every record was the node's busiest code during a burst of wakes), and
only from a mirror that holds its own last write. Lease counts come
from the activator (`leased_on`), which runs in the same process as the controller.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from pydantic import BaseModel

from wakeful.domain import keys, trace
from wakeful.domain.lifecycle import Transition, can, transition
from wakeful.domain.models import Cordon, Node, Pool, Sandbox, SandboxStatus
from wakeful.store import Conflict, Delete, Item, Require, Store, StoreError
from wakeful.store.reflector import Feed, reflect_all

from .plan import Create, Drain, MarkDead, Remove, Stop, cooldown, crashed, plan_pool

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def with_cordon(node: Node, cordon: Cordon | None) -> Node:
    if cordon is None:
        return node
    return node.model_copy(update={"cordoned": True, "evacuating": cordon.evacuate})


class Mirror:
    """What the controller plans from between listings: every pool, sandbox, node and cordon
    as the reflector last delivered them (each decoded once, when it changed), and `changed`,
    set by any listing or change.

    `revision`: every write up to it is in every table. A listing replaces the tables one by
    one, each as of its own revision, so after one it is the oldest of them (the watch then
    goes on from there, in order); `listed` is False while a listing is under way."""

    def __init__(self) -> None:
        self.changed = anyio.Event()
        self.revision = 0
        self.listed = False
        self.pools: _Table[Pool] = _Table(self)
        self.sandboxes: _Table[Sandbox] = _Table(self)
        self.nodes: _Table[Node] = _Table(self)
        self.cordons: _Table[Cordon] = _Table(self)

    def relisting(self) -> None:
        self.listed = False

    def done_listing(self) -> None:
        tables = (self.pools, self.sandboxes, self.nodes, self.cordons)
        self.revision = min(table.listed_at for table in tables)
        self.listed = True
        self.changed.set()

    def saw(self, revision: int) -> None:
        """A watched change: every revision before it was delivered already."""
        self.revision = max(self.revision, revision)
        self.changed.set()

    def state(self) -> State:
        return State(
            list(self.pools.items.values()),
            list(self.sandboxes.items.values()),
            list(self.nodes.items.values()),
            list(self.cordons.items.values()),
        )


class _Table(Generic[M]):
    """One prefix of the `Mirror` (a reflector view)."""

    def __init__(self, mirror: Mirror) -> None:
        self._mirror = mirror
        self.items: dict[str, Item[M]] = {}
        self.listed_at = 0

    def replace(self, items: list[Item[M]], revision: int) -> None:
        self.items = {item.key: item for item in items}
        self.listed_at = revision
        self._mirror.changed.set()

    def put(self, item: Item[M]) -> None:
        self.items[item.key] = item
        self._mirror.saw(item.revision)

    def delete(self, key: str, revision: int) -> None:
        self.items.pop(key, None)
        self._mirror.saw(revision)


@dataclass(frozen=True)
class State:
    """What one tick plans from."""

    pools: list[Item[Pool]]
    sandboxes: list[Item[Sandbox]]
    nodes: list[Item[Node]]
    cordons: list[Item[Cordon]]


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
        self._written = 0
        """The revision of this controller's latest write: a plan needs a view that has it."""
        self._unsure = False
        """A write failed with a store error (it may have committed): plan from listings."""
        self._trust_leases_after = clock() + drain_grace
        """Lease counts live in the activator's memory: right after it (re)starts they read 0
        although ingresses still hold leases they will renew. Until one lease TTL has passed,
        a draining sandbox is assumed busy, so a restart cuts no request short."""

    async def run(self) -> None:
        """Reconcile on every change to pools, sandboxes, nodes or cordons, and every interval
        anyway (lease releases that unblock a drain are not store changes).

        It plans from a `Mirror` of the four prefixes, kept by one watch, once that mirror
        holds every write this controller made (its own last write's revision): a plan from a
        view that has not seen the sandbox it just created would create another. Until then
        (and before the first listing) it lists them from the store, as `tick` does."""
        mirror = Mirror()
        feeds: list[Feed[Any]] = [
            Feed(keys.POOLS, Pool, mirror.pools),
            Feed(keys.SANDBOXES, Sandbox, mirror.sandboxes),
            Feed(keys.NODES, Node, mirror.nodes),
            Feed(keys.CORDONS, Cordon, mirror.cordons),
        ]

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(
                lambda: reflect_all(
                    self._store,
                    feeds,
                    what="pool controller",
                    listed=mirror.done_listing,
                    relisting=mirror.relisting,
                )
            )
            while True:
                mirror.changed = anyio.Event()
                try:
                    await self.step(mirror)
                except StoreError as exc:
                    # A write may have committed without its revision coming back: plan from
                    # the store until a listing has certainly seen it.
                    self._unsure = True
                    log.warning("pool controller could not reconcile: %s", exc)
                with anyio.move_on_after(self._interval):
                    await mirror.changed.wait()

    async def step(self, mirror: Mirror) -> None:
        """One reconciliation from `mirror` if it holds this controller's own last write,
        else from a fresh listing."""
        if mirror.listed and not self._unsure and mirror.revision >= self._written:
            await self._reconcile(mirror.state())
        else:
            await self.tick()

    async def tick(self) -> None:
        """One reconciliation from a fresh listing of the store."""
        self._unsure = False  # what this lists has every write that committed before it
        await self._reconcile(
            State(
                (await self._store.list(keys.POOLS, Pool)).items,
                (await self._store.list(keys.SANDBOXES, Sandbox)).items,
                (await self._store.list(keys.NODES, Node)).items,
                (await self._store.list(keys.CORDONS, Cordon)).items,
            )
        )

    async def _reconcile(self, state: State) -> None:
        pools = {p.value.name: p for p in state.pools}
        sandboxes = state.sandboxes
        cordons = {c.value.node: c.value for c in state.cordons}
        nodes = [with_cordon(n.value, cordons.get(n.value.name)) for n in state.nodes]
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
        self._wrote(revision)
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
                self._wrote(await self._store.create(keys.sandbox(sandbox_id), record))
                log.info("placed %s on %s", sandbox_id, action.node, extra={"pool": pool.name})
                trace.mark("placed", pool.app)
            elif isinstance(action, Remove):
                item = items[action.sandbox_id]
                self._wrote(
                    await self._store.txn([Require(item.key, item.revision)], [Delete(item.key)])
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
                self._wrote(
                    await self._store.update(
                        item.key, item.value.model_copy(update=update), item.revision
                    )
                )
        except Conflict:
            pass  # another writer moved first; the next tick plans from fresh state

    def _wrote(self, revision: int) -> None:
        self._written = max(self._written, revision)
