"""The activator's watched view of apps, pools and sandboxes.

Theory of operation:
- The view is the only consumer of the store watch (`follow`, one reflection of `apps/`,
  `pools/` and `sandboxes/` through `wakeful.store.reflector`). It is written by that task, and
  by the scale-up and activity writers applying what they wrote or re-read; every write takes
  only a revision newer than the cached one (invariant 5), and a listing removes only what the
  store deleted before the listing's revision. A record that does not validate counts as
  absent, as everywhere else.
- The request path reads it synchronously (`resolve`, `candidates`) and never awaits while
  holding what it read.
- What the rest of the activator must do about a change (wake a pool's waiters, drop the
  leases on a sandbox that left) it is told through `ViewListener`, in the same step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio

from wakeful.activator import decisions
from wakeful.aio import trace
from wakeful.domain import keys
from wakeful.domain.leases import NoCapacity, UnknownApp
from wakeful.domain.models import GONE, SIZED, App, Node, Pool, Sandbox, SandboxStatus
from wakeful.store import Item, Store
from wakeful.store.reflector import Feed, reflect_all

log = logging.getLogger(__name__)
M = TypeVar("M")

# GONE: statuses whose leases are dropped (a draining sandbox keeps its leases until they are
# released); LIVE: counted in the pool's size. Both defined once, in wakeful.domain.models.
LIVE = SIZED


@dataclass(slots=True, eq=False)
class PoolState:
    """A pool's record and the ids of its sandboxes. Replaced, not reused, if the pool is
    removed and comes back: a request holding the old one sees it is stale."""

    item: Item[Pool]
    sandboxes: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.item.value.name


class ViewListener(Protocol):
    def pool_changed(self, pool: str) -> None:
        """A newer pool record (or a new pool) was applied."""

    def pool_removed(self, pool: str) -> None:
        """The pool left the store."""

    def sandbox_routable(self, pool: str) -> None:
        """A sandbox of the pool became routable."""

    def sandbox_gone(self, sandbox_id: str) -> None:
        """A sandbox is stopping, stopped or dead: its leases end."""

    def sandbox_removed(self, sandbox_id: str) -> None:
        """A sandbox left the store."""

    def relisted(self) -> None:
        """The view was re-listed: every waiter runs admission again."""


SETTLE_PAUSE = 0.02
SETTLE_POLLS = 100
"""A view caught mid-change of route is waited out for up to 2 s (`View.settled`)."""


class NoServingPool(UnknownApp):
    """The app's record names a version whose pool does not serve in this view: a change of
    route in flight (a pool record read ahead of its app's record, `reread`). `Activator`
    waits for the view to settle before it answers."""


class View:
    def __init__(self, store: Store, listener: ViewListener) -> None:
        self._store = store
        self._listener = listener
        self.apps: dict[str, Item[App]] = {}
        self.pools: dict[str, PoolState] = {}
        self.sandboxes: dict[str, Item[Sandbox]] = {}
        self.withheld: set[str] = set()
        """Sandboxes being suspended: out of admission from the step that decided it until
        the write is done (`wakeful.activator.suspend`), so no lease lands on one in between."""
        self.nodes: dict[str, Item[Node]] = {}
        """Every node's record (the suspended sandboxes it asks to stop: `Node.evict`)."""
        self.tunnelled: dict[str, Item[Node]] = {}
        """Nodes that dial out (`Node.tunnel`): their sandboxes are routable only while the
        node holds a stream on some ingress replica (seed 003)."""
        self.synced = anyio.Event()

    # -- feeding it -------------------------------------------------------------------------

    def feeds(self) -> list[Feed[Any]]:
        """The four prefixes the view mirrors, for `wakeful.store.reflector`."""
        return _mirrors(self)

    async def follow(self) -> None:
        """Mirror the store until cancelled (list, watch, list again after a resync)."""
        await reflect_all(self._store, self.feeds(), what="activator view", listed=self._listed)

    async def resync(self) -> None:
        """Re-list everything once, refresh what the store has moved past, wake every waiter."""
        for feed in self.feeds():
            listing = await self._store.list(feed.prefix, feed.model)
            feed.view.replace(listing.items, listing.revision)
        self._listed()

    def _listed(self) -> None:
        self.synced.set()
        self._listener.relisted()

    def apply_app(self, item: Item[App]) -> None:
        cached = self.apps.get(item.value.name)
        if cached is None or item.revision > cached.revision:
            self.apps[item.value.name] = item

    def apply_pool(self, item: Item[Pool]) -> None:
        name = item.value.name
        state = self.pools.get(name)
        if state is None:
            state = self.pools[name] = PoolState(item)
            state.sandboxes = {s for s, sb in self.sandboxes.items() if sb.value.pool == name}
        elif item.revision <= state.item.revision:
            return
        state.item = item
        self._listener.pool_changed(name)

    def remove_pool(self, name: str) -> None:
        del self.pools[name]
        self._listener.pool_removed(name)

    def apply_sandbox(self, item: Item[Sandbox]) -> None:
        sandbox = item.value
        cached = self.sandboxes.get(sandbox.id)
        if cached is not None and item.revision <= cached.revision:
            return
        self.sandboxes[sandbox.id] = item
        state = self.pools.get(sandbox.pool)
        if state is not None:
            state.sandboxes.add(sandbox.id)
        if sandbox.status in GONE:
            self._listener.sandbox_gone(sandbox.id)
        was_routable = cached is not None and cached.value.routable
        if sandbox.routable and not was_routable and state is not None:
            trace.mark("routable", sandbox.app)
            self._listener.sandbox_routable(sandbox.pool)

    def apply_node(self, item: Item[Node]) -> None:
        node = item.value
        cached = self.nodes.get(node.name)
        if cached is not None and item.revision <= cached.revision:
            return
        self.nodes[node.name] = item
        was = self._reachable_by_tunnel(node.name)
        if node.tunnel is None:
            self.tunnelled.pop(node.name, None)
        else:
            self.tunnelled[node.name] = item
        if not was and self._reachable_by_tunnel(node.name):
            self._tunnel_back(node.name)

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.tunnelled.pop(name, None)

    def _reachable_by_tunnel(self, node: str) -> bool:
        item = self.tunnelled.get(node)
        return item is not None and item.value.tunnel is not None and item.value.tunnel.reachable

    def _tunnel_back(self, node: str) -> None:
        """A dial-out node holds a stream again: its routable sandboxes' pools wake."""
        for item in self.sandboxes.values():
            sandbox = item.value
            if sandbox.node == node and sandbox.routable and sandbox.pool in self.pools:
                self._listener.sandbox_routable(sandbox.pool)

    def serves(self, sandbox: Sandbox) -> bool:
        """Admission may place a request on it: routable, and reachable (a sandbox of a
        dial-out node only while that node holds a tunnel stream somewhere)."""
        if not sandbox.routable or not sandbox.address or sandbox.id in self.withheld:
            return False
        if sandbox.address.startswith("tunnel://"):
            return sandbox.node is not None and self._reachable_by_tunnel(sandbox.node)
        return True

    def remove_sandbox(self, sandbox_id: str) -> None:
        item = self.sandboxes.pop(sandbox_id)
        state = self.pools.get(item.value.pool)
        if state is not None:
            state.sandboxes.discard(sandbox_id)
        self._listener.sandbox_removed(sandbox_id)

    async def reread(self, state: PoolState) -> bool:
        """Refresh one pool from the store (newer revisions only); False if it is gone."""
        fresh = await self._store.get(state.item.key, Pool)
        if fresh is None:
            if self.pools.get(state.name) is state:
                self.remove_pool(state.name)
            return False
        self.apply_pool(fresh)
        return True

    # -- reading it -------------------------------------------------------------------------

    async def settled(self, app: str, version: str | None) -> PoolState:
        """`resolve`, waiting out a view caught mid-change of route (`NoServingPool`: a pool
        record read ahead of its app's, issue 39) for up to `SETTLE_POLLS` pauses of
        `SETTLE_PAUSE` seconds (a count, not a clock: the view moves with the store, not with
        the ledger's clock); past that, 503 with Retry-After, not a 404: the app exists (one
        with no active version at all is still an unknown app's 404)."""
        for _ in range(SETTLE_POLLS):
            try:
                return self.resolve(app, version)
            except NoServingPool:
                await anyio.sleep(SETTLE_PAUSE)
        try:
            return self.resolve(app, version)
        except NoServingPool as exc:
            raise NoCapacity(str(exc), retry_after=1) from None

    def resolve(self, app: str, version: str | None) -> PoolState:
        """The app's pool for `version` (its active version by default) that takes traffic.
        A version whose pool no longer serves (an ingress's split, tag or route older than
        this view: the change that took the version out retired its pool) follows the app's
        route to the active version, as a request waiting on a retired pool does."""
        found = self.apps.get(app)
        if found is None:
            raise UnknownApp(f"no app named {app!r}")
        if version is not None:
            state = self._serving(app, version)
            if state is not None:
                return state
        version = found.value.active_version
        if version is None:
            raise UnknownApp(f"app {app!r} has no active version")
        state = self._serving(app, version)
        if state is None:
            raise NoServingPool(f"app {app!r} has no pool serving version {version!r} now")
        return state

    def _serving(self, app: str, version: str) -> PoolState | None:
        for state in self.pools.values():
            pool = state.item.value
            if pool.app == app and pool.version == version and not pool.retired:
                return state
        return None

    def current(self, state: PoolState) -> bool:
        """The view still holds this very pool, and it takes traffic."""
        return self.pools.get(state.name) is state and not state.item.value.retired

    def candidates(self, state: PoolState, leased: Mapping[str, int]) -> list[decisions.Candidate]:
        """The pool's routable sandboxes (running, ready, with an address), in a stable order."""
        found = []
        for sandbox_id in sorted(state.sandboxes):
            sandbox = self.sandboxes[sandbox_id].value
            if self.serves(sandbox):
                assert sandbox.address is not None
                url = sandbox.address
                if "://" not in url:
                    url = f"http://{url}"
                found.append(decisions.Candidate(sandbox_id, url, leased.get(sandbox_id, 0)))
        return found

    def live(self, state: PoolState) -> int:
        return sum(1 for s in state.sandboxes if self.sandboxes[s].value.status in LIVE)

    def ready(self, state: PoolState) -> int:
        """Routable sandboxes, those being suspended left out."""
        return sum(
            1
            for s in state.sandboxes
            if self.sandboxes[s].value.routable and s not in self.withheld
        )

    def suspended(self, state: PoolState) -> list[Item[Sandbox]]:
        """The pool's suspended sandboxes, the most recently suspended first (the warmest)."""
        found = [
            self.sandboxes[s]
            for s in state.sandboxes
            if self.sandboxes[s].value.status is SandboxStatus.SUSPENDED
        ]
        return sorted(found, key=lambda i: (-i.value.suspended_at, i.value.id))

    def leased_on_running(self, state: PoolState, leased: Mapping[str, int]) -> int:
        return sum(
            leased.get(s, 0)
            for s in state.sandboxes
            if self.sandboxes[s].value.status is SandboxStatus.RUNNING
        )

    def routable(self, sandbox_id: str) -> bool:
        item = self.sandboxes.get(sandbox_id)
        return item is not None and self.serves(item.value)


# -- the three prefixes, as reflector views ---------------------------------------------------


@dataclass(frozen=True)
class _Mirror(Generic[M]):
    """One prefix of the view: a write applies when newer, a delete or a listing that lacks
    the key removes it only when the cached record is older than the delete or the listing
    (the activator's own writes may have put a newer one)."""

    prefix: str
    name_of: Callable[[M], str]
    cached_revision: Callable[[str], int | None]
    apply: Callable[[Item[M]], None]
    remove: Callable[[str], None]
    names: Callable[[], list[str]]

    def replace(self, items: list[Item[M]], revision: int) -> None:
        listed = {self.name_of(item.value) for item in items}
        for name in self.names():
            cached = self.cached_revision(name)
            if name not in listed and cached is not None and cached <= revision:
                self.remove(name)
        for item in items:
            self.apply(item)

    def put(self, item: Item[M]) -> None:
        self.apply(item)

    def delete(self, key: str, revision: int) -> None:
        name = keys.name_in(key, self.prefix)
        cached = self.cached_revision(name)
        if cached is not None and cached < revision:
            self.remove(name)


def _mirrors(view: View) -> list[Feed[Any]]:
    def app_revision(name: str) -> int | None:
        app = view.apps.get(name)
        return None if app is None else app.revision

    def pool_revision(name: str) -> int | None:
        pool = view.pools.get(name)
        return None if pool is None else pool.item.revision

    def sandbox_revision(name: str) -> int | None:
        sandbox = view.sandboxes.get(name)
        return None if sandbox is None else sandbox.revision

    def remove_app(name: str) -> None:
        del view.apps[name]

    apps: _Mirror[App] = _Mirror(
        keys.APPS, lambda a: a.name, app_revision, view.apply_app, remove_app, lambda: [*view.apps]
    )
    pools: _Mirror[Pool] = _Mirror(
        keys.POOLS,
        lambda p: p.name,
        pool_revision,
        view.apply_pool,
        view.remove_pool,
        lambda: [*view.pools],
    )
    sandboxes: _Mirror[Sandbox] = _Mirror(
        keys.SANDBOXES,
        lambda s: s.id,
        sandbox_revision,
        view.apply_sandbox,
        view.remove_sandbox,
        lambda: [*view.sandboxes],
    )

    def node_revision(name: str) -> int | None:
        node = view.nodes.get(name)
        return None if node is None else node.revision

    nodes: _Mirror[Node] = _Mirror(
        keys.NODES,
        lambda n: n.name,
        node_revision,
        view.apply_node,
        view.remove_node,
        lambda: [*view.nodes],
    )
    return [
        Feed(keys.APPS, App, apps),
        Feed(keys.POOLS, Pool, pools),
        Feed(keys.SANDBOXES, Sandbox, sandboxes),
        Feed(keys.NODES, Node, nodes),
    ]
