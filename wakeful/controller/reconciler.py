"""The pool controller's shell: each tick, take pools, sandboxes, nodes, cordons, states and
the apps' secrets generations, plan, act.

Every write is a compare-and-set on the record it was planned from; a conflict just means
another writer moved first, and the next tick plans again from fresh state. Running, it plans
from a `Mirror` of the store kept by one watch (`mirror.py`), and only from a mirror that
holds its own last write. What to do is decided by the pure functions of `plan.py`; this
module gathers their inputs and carries their actions out. Lease counts come from the
activator (`leased_on`), which runs in the same process as the controller.

A sandbox it creates records its app's `restart_generation` as this view has it
(`Sandbox.secrets_generation`). A view that has not seen the latest secrets change yet creates
it at a stale generation: the control plane gives its node no secrets for it (it is behind),
so its start fails and it is replaced by one at the current generation.

A sandbox it creates also carries its placement (`Sandbox.placement`): the control plane's MAC
over the record's id, app, pool, node and secrets generation, from the `Placer` it was given
(the key ring's `place`, `wakeful.secrets.keys`). A node may write `sandboxes/`, but only a
record this controller placed gets its app's secrets.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import anyio
from prometheus_client import CollectorRegistry

from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain import state as state_rules
from wakeful.domain.lifecycle import Transition, can, transition
from wakeful.domain.models import ON_NODE, AppState, Cordon, Node, Pool, Sandbox, SandboxStatus
from wakeful.store import Conflict, Delete, Item, Put, Require, Store, StoreError
from wakeful.store.reflector import Feed, reflect_all

from .health import CrashCollector
from .metrics import EvacuationMetrics, TunnelCollector
from .mirror import Mirror, SecretsRestart, State
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
    lost_holders,
    plan_pool,
    tally_crashes,
    with_cordon,
)

log = logging.getLogger(__name__)


class Placer(Protocol):
    """The placement of a sandbox about to be created (`Sandbox.placement`)."""

    def __call__(
        self, sandbox_id: str, app: str, pool: str, node: str, secrets_generation: int, /
    ) -> str: ...


def unplaced(sandbox_id: str, app: str, pool: str, node: str, secrets_generation: int, /) -> str:
    """No placement: a controller without the control plane's keys (its own tests). A node
    gets no secrets for a sandbox created so."""
    return ""


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
        placer: Placer = unplaced,
    ) -> None:
        """`evacuate_concurrency`: stateful sandboxes moving off evacuating nodes at once;
        `evacuate_grace`: how long a moving one waits for its leases; `takeback_after`: how
        long a node holding a state must be gone before it is taken back (`plan.Moves`);
        `placer`: what signs a created sandbox's placement."""
        self._store = store
        self._placer = placer
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
        """Reconcile on every change to pools, sandboxes, nodes, cordons, states or secrets,
        and every interval anyway (lease releases that unblock a drain are not store changes).

        It plans from a `Mirror` of those prefixes, kept by one watch, once that mirror
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
            Feed(keys.SECRETS, SecretsRestart, mirror.secrets),
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
                (await self._store.list(keys.SECRETS, SecretsRestart)).items,
            )
        )

    async def _reconcile(self, state: State) -> None:
        pools = {p.value.name: p for p in state.pools}
        sandboxes = state.sandboxes
        cordons = {c.value.node: c.value for c in state.cordons}
        nodes = [with_cordon(n.value, cordons.get(n.value.name)) for n in state.nodes]
        states = {s.value.app: s for s in state.states}
        restarts = state.restart_generations()
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
            generation = 0 if pool_item is None else restarts.get(pool_item.value.app, 0)
            if pool_item is not None:
                pool_item = await self._track_crashes(
                    pool_item, list(items.values()), now, generation
                )
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
                restart_generation=generation,
            )
            for action in actions:
                await self._act(action, pool_item, items, now, app_state, evacuating, generation)

    def _lost(
        self, states: dict[str, Item[AppState]], live: set[str], now: float
    ) -> frozenset[str]:
        """The nodes holding a state that have been gone `takeback_after` seconds."""
        holders = {s.value.node for s in states.values() if s.value.node is not None}
        self._gone_since, lost = lost_holders(
            self._gone_since, holders, live, now, self._takeback_after
        )
        return lost

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
        self, pool_item: Item[Pool], items: list[Item[Sandbox]], now: float, generation: int
    ) -> Item[Pool]:
        """Count crashes before their records are removed (`tally_crashes`)."""
        pool = pool_item.value
        updated = tally_crashes(pool, [i.value for i in items], now, generation)
        if updated is None:
            return pool_item
        if updated.crash_count > pool.crash_count:
            log.warning(
                "app %s failed to boot (%d in a row): %s",
                pool.app,
                updated.crash_count,
                updated.last_crash_log[-500:],
                extra={"pool": pool.name},
            )
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
        generation: int = 0,
    ) -> None:
        """Carry out one action; `generation`: the app's `restart_generation`, which a
        sandbox created now records."""
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
                    secrets_generation=generation,
                    placement=self._placer(
                        sandbox_id, pool.app, pool.name, action.node, generation
                    ),
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
