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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel

from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain import state as state_rules
from wakeful.domain.lifecycle import Transition, can, transition
from wakeful.domain.models import ON_NODE, AppState, Cordon, Node, Pool, Sandbox, SandboxStatus
from wakeful.store import Conflict, Delete, Item, Put, Require, Store, StoreError
from wakeful.store.reflector import Feed, reflect_all

from .health import CrashCollector
from .plan import (
    Action,
    Create,
    Drain,
    MarkDead,
    Moves,
    Remove,
    Stop,
    TakeBack,
    choose_moves,
    cooldown,
    crashed,
    plan_pool,
)

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class EvacuationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.evacuating = Gauge(
            "wakeful_node_evacuating",
            "1 while a node is drained with evacuation and still holds sandboxes or state",
            ["node"],
            registry=registry,
        )
        self.evacuations = Counter(
            "wakeful_node_evacuations_total",
            "Stateful sandboxes moved off an evacuating node (moved), or whose state its node "
            "had to keep (failed)",
            ["result"],
            registry=registry,
        )
        self.conflicts = Counter(
            "wakeful_node_release_conflicts_total",
            "Adoptions of a state refused because another writer moved it first (stale epoch)",
            registry=registry,
        )
        self._seen: set[str] = set()

    def observe(self, evacuating: set[str]) -> None:
        """`evacuating`: the nodes drained with evacuation that still hold something."""
        for node in self._seen | evacuating:
            self.evacuating.labels(node=node).set(1 if node in evacuating else 0)
        self._seen |= evacuating


class TunnelCollector(Collector):
    """Dial-out nodes' streams and coverage actions, from the coverage tables they publish in
    their records (seed 003): a node behind NAT cannot be scraped, the control plane can."""

    def __init__(self, mirror: Callable[[], Mirror | None]) -> None:
        self._mirror = mirror

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "wakeful_node_tunnel_streams",
            "A dial-out node's tunnel streams on each ingress replica, by state (idle, busy), "
            "as its last coverage tick saw them",
            labels=["node", "replica", "state"],
        )
        coverage = GaugeMetricFamily(
            "wakeful_node_tunnel_coverage",
            "1 for a dial-out node's coverage state on each ingress replica (covered, growing, "
            "filling, overdue, evacuated)",
            labels=["node", "replica", "state"],
        )
        reachable = GaugeMetricFamily(
            "wakeful_node_tunnel_reachable",
            "1 while a dial-out node holds a tunnel stream on some ingress replica",
            labels=["node"],
        )
        actions = CounterMetricFamily(
            "wakeful_node_tunnel_coverage_actions",
            "Streams a dial-out node opened or closed, by coverage action (grow, fill, "
            "evacuate, recycle, prune, cap), since its agent started",
            labels=["node", "action"],
        )
        mirror = self._mirror()
        for item in [] if mirror is None else list(mirror.nodes.items.values()):
            node, tunnel = item.value.name, item.value.tunnel
            if tunnel is None:
                continue
            reachable.add_metric([node], 1 if tunnel.reachable else 0)
            for replica in tunnel.replicas:
                streams.add_metric([node, replica.replica, "busy"], replica.busy)
                idle = max(0, replica.streams - replica.busy)
                streams.add_metric([node, replica.replica, "idle"], idle)
                coverage.add_metric([node, replica.replica, replica.state], 1)
            for action, count in sorted(tunnel.actions.items()):
                actions.add_metric([node, action], count)
        yield from (streams, coverage, reachable, actions)


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
        self.states: _Table[AppState] = _Table(self)

    def relisting(self) -> None:
        self.listed = False

    def done_listing(self) -> None:
        tables = (self.pools, self.sandboxes, self.nodes, self.cordons, self.states)
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
            list(self.states.items.values()),
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
    states: list[Item[AppState]]


class Reconciler:
    def __init__(
        self,
        store: Store,
        leased_on: Callable[[str], int],
        *,
        interval: float = 1.0,
        drain_grace: float = 0.0,
        clock: Callable[[], float] = time.time,
        evacuate_concurrency: int = 4,
        evacuate_grace: float = 30.0,
        takeback_after: float = 300.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`evacuate_concurrency`: stateful sandboxes moving off evacuating nodes at once;
        `evacuate_grace`: how long a moving one waits for its leases; `takeback_after`: how
        long a node holding a state must be gone before it is taken back (`plan.Moves`)."""
        self._store = store
        self._budget = evacuate_concurrency
        self._grace = evacuate_grace
        self._takeback_after = takeback_after
        self._gone_since: dict[str, float] = {}
        """When this controller first saw each node holding a state gone (its own memory:
        a new leader waits the whole time again, the safe way)."""
        self.metrics = EvacuationMetrics(registry or CollectorRegistry())
        if registry is not None:
            registry.register(TunnelCollector(lambda: self._mirror))
            registry.register(CrashCollector(lambda: self._mirror, clock))
        self._failed_seen: set[tuple[str, int]] = set()
        self._mirror: Mirror | None = None
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

    @property
    def mirror(self) -> Mirror | None:
        """What it plans from, once it runs (the dashboard reads it too)."""
        return self._mirror

    async def run(self) -> None:
        """Reconcile on every change to pools, sandboxes, nodes or cordons, and every interval
        anyway (lease releases that unblock a drain are not store changes).

        It plans from a `Mirror` of the four prefixes, kept by one watch, once that mirror
        holds every write this controller made (its own last write's revision): a plan from a
        view that has not seen the sandbox it just created would create another. Until then
        (and before the first listing) it lists them from the store, as `tick` does."""
        mirror = self._mirror = Mirror()
        feeds: list[Feed[Any]] = [
            Feed(keys.POOLS, Pool, mirror.pools),
            Feed(keys.SANDBOXES, Sandbox, mirror.sandboxes),
            Feed(keys.NODES, Node, mirror.nodes),
            Feed(keys.CORDONS, Cordon, mirror.cordons),
            Feed(keys.STATES, AppState, mirror.states),
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

    def nudge(self) -> None:
        """Reconcile now: something it plans from but does not watch changed (the last lease
        on a draining sandbox was released)."""
        if self._mirror is not None:
            self._mirror.changed.set()

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
                (await self._store.list(keys.STATES, AppState)).items,
            )
        )

    async def _reconcile(self, state: State) -> None:
        pools = {p.value.name: p for p in state.pools}
        sandboxes = state.sandboxes
        cordons = {c.value.node: c.value for c in state.cordons}
        nodes = [with_cordon(n.value, cordons.get(n.value.name)) for n in state.nodes]
        states = {s.value.app: s for s in state.states}
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
        leased = {i.value.id: self._leased_on(i.value.id) for i in sandboxes}
        if now < self._trust_leases_after:
            leased = {sandbox_id: max(count, 1) for sandbox_id, count in leased.items()}
        evacuating = {n.name for n in nodes if n.evacuating}
        stateful_pools = {name for name, p in pools.items() if p.value.spec.state is not None}
        moves = Moves(
            choose_moves(
                [i.value for i in sandboxes if i.value.pool in stateful_pools],
                leased,
                evacuating,
                self._budget,
            ),
            self._grace,
            self._lost(states, {n.name for n in nodes}, now),
        )
        self._observe(states, cordons, sandboxes)
        for name in sorted(set(pools) | set(by_pool)):
            pool_item = pools.get(name)
            items = {i.value.id: i for i in by_pool.get(name, [])}
            if pool_item is not None:
                pool_item = await self._track_crashes(pool_item, list(items.values()), now)
            app_state = None if pool_item is None else states.get(pool_item.value.app)
            actions = plan_pool(
                pool_item.value if pool_item else None,
                [i.value for i in items.values()],
                {sandbox_id: leased[sandbox_id] for sandbox_id in items},
                nodes,
                placed,
                now,
                state=None if app_state is None else app_state.value,
                moves=moves,
            )
            for action in actions:
                await self._act(action, pool_item, items, now, app_state, evacuating)

    def _lost(
        self, states: dict[str, Item[AppState]], live: set[str], now: float
    ) -> frozenset[str]:
        """The nodes holding a state that have been gone `takeback_after` seconds."""
        holders = {s.value.node for s in states.values() if s.value.node is not None}
        gone = holders - live
        self._gone_since = {n: self._gone_since.get(n, now) for n in gone}
        return frozenset(
            n for n, since in self._gone_since.items() if now - since >= self._takeback_after
        )

    def _observe(
        self,
        states: dict[str, Item[AppState]],
        cordons: dict[str, Cordon],
        sandboxes: list[Item[Sandbox]],
    ) -> None:
        """The evacuation metrics: which nodes still hold sandboxes or state while evacuating,
        and each state an evacuating node had to keep (counted once)."""
        holding = {s.value.node for s in sandboxes if s.value.status in ON_NODE}
        holding |= {s.value.node for s in states.values()}
        self.metrics.observe(
            {name for name, c in cordons.items() if c.evacuate and name in holding}
        )
        for item in states.values():
            held = item.value
            key = (held.app, held.epoch)
            cordon = cordons.get(held.node or "")
            if not held.kept or cordon is None or not cordon.evacuate:
                continue
            if key not in self._failed_seen:
                self._failed_seen.add(key)
                self.metrics.evacuations.labels(result="failed").inc()

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
        action: Action,
        pool_item: Item[Pool] | None,
        items: dict[str, Item[Sandbox]],
        now: float,
        app_state: Item[AppState] | None = None,
        evacuating: frozenset[str] | set[str] = frozenset(),
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
                if action.adopt is None:
                    self._wrote(await self._store.create(keys.sandbox(sandbox_id), record))
                else:
                    await self._adopt(action, pool_item, app_state, record, now, evacuating)
                log.info("placed %s on %s", sandbox_id, action.node, extra={"pool": pool.name})
                trace.mark("placed", pool.app)
            elif isinstance(action, TakeBack):
                assert app_state is not None
                taken = state_rules.take_back(app_state.value, action.node, now)
                if isinstance(taken, state_rules.Stale):
                    return
                self._wrote(await self._store.update(app_state.key, taken, app_state.revision))
                log.warning("took back the state of %s: %s", action.app, taken.error)
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
                if isinstance(action, Drain):
                    update["draining_since"] = now
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

    async def _adopt(
        self,
        action: Create,
        pool_item: Item[Pool],
        app_state: Item[AppState] | None,
        record: Sandbox,
        now: float,
        evacuating: frozenset[str] | set[str],
    ) -> None:
        """Create a stateful app's sandbox and adopt its state for it, in one transaction on
        the state record as planned (absent, or free at `action.adopt`) and on the pool (an app
        deleted meanwhile gets no state record back). A conflict is another writer that moved
        first: nothing is written."""
        assert action.adopt is not None
        current = None if app_state is None else app_state.value
        adopted = state_rules.adopt(current, record.app, action.node, record.id, action.adopt, now)
        if isinstance(adopted, state_rules.Stale):
            self.metrics.conflicts.inc()
            return
        key = keys.state(record.app)
        require = [Require(key, 0 if app_state is None else app_state.revision)]
        require.append(Require(keys.sandbox(record.id), 0))
        require.append(Require(pool_item.key, pool_item.revision))  # its app not deleted since
        try:
            revision = await self._store.txn(
                require, [Put(key, adopted), Put(keys.sandbox(record.id), record)]
            )
        except Conflict:
            now_state = await self._store.get(key, AppState)
            if (now_state and now_state.revision) != (app_state and app_state.revision):
                self.metrics.conflicts.inc()  # another adopter (or holder) moved it first
            raise
        self._wrote(revision)
        if current is not None and current.released_by in evacuating and adopted.moved_from:
            self.metrics.evacuations.labels(result="moved").inc()

    def _wrote(self, revision: int) -> None:
        self._written = max(self._written, revision)
