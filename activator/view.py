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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from wakeful.activator import decisions
from wakeful.domain import keys
from wakeful.domain.leases import UnknownApp
from wakeful.domain.models import GONE, SIZED, App, Pool, Sandbox, SandboxStatus
from wakeful.store import Item, Store
from wakeful.store.reflector import Feed, reflect_all

log = logging.getLogger(__name__)

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


class View:
    def __init__(self, store: Store, listener: ViewListener) -> None:
        self._store = store
        self._listener = listener
        self.apps: dict[str, Item[App]] = {}
        self.pools: dict[str, PoolState] = {}
        self.sandboxes: dict[str, Item[Sandbox]] = {}
        self.synced = anyio.Event()

    # -- feeding it -------------------------------------------------------------------------

    def feeds(self) -> list[Feed[Any]]:
        """The three prefixes the view mirrors, for `wakeful.store.reflector`."""
        return [
            Feed(keys.APPS, App, _Apps(self)),
            Feed(keys.POOLS, Pool, _Pools(self)),
            Feed(keys.SANDBOXES, Sandbox, _Sandboxes(self)),
        ]

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
            self._listener.sandbox_routable(sandbox.pool)

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

    def resolve(self, app: str, version: str | None) -> PoolState:
        """The app's pool for `version` (its active version by default) that takes traffic."""
        found = self.apps.get(app)
        if found is None:
            raise UnknownApp(f"no app named {app!r}")
        version = version or found.value.active_version
        if version is None:
            raise UnknownApp(f"app {app!r} has no active version")
        for state in self.pools.values():
            pool = state.item.value
            if pool.app == app and pool.version == version and not pool.retired:
                return state
        raise UnknownApp(f"app {app!r} has no pool for version {version!r}")

    def current(self, state: PoolState) -> bool:
        """The view still holds this very pool, and it takes traffic."""
        return self.pools.get(state.name) is state and not state.item.value.retired

    def candidates(self, state: PoolState, leased: Mapping[str, int]) -> list[decisions.Candidate]:
        """The pool's routable sandboxes (running, ready, with an address), in a stable order."""
        found = []
        for sandbox_id in sorted(state.sandboxes):
            sandbox = self.sandboxes[sandbox_id].value
            if sandbox.routable and sandbox.address:
                url = sandbox.address
                if "://" not in url:
                    url = f"http://{url}"
                found.append(decisions.Candidate(sandbox_id, url, leased.get(sandbox_id, 0)))
        return found

    def live(self, state: PoolState) -> int:
        return sum(1 for s in state.sandboxes if self.sandboxes[s].value.status in LIVE)

    def ready(self, state: PoolState) -> int:
        return sum(1 for s in state.sandboxes if self.sandboxes[s].value.routable)

    def leased_on_running(self, state: PoolState, leased: Mapping[str, int]) -> int:
        return sum(
            leased.get(s, 0)
            for s in state.sandboxes
            if self.sandboxes[s].value.status is SandboxStatus.RUNNING
        )

    def routable(self, sandbox_id: str) -> bool:
        item = self.sandboxes.get(sandbox_id)
        return item is not None and item.value.routable


# -- the three prefixes, as reflector views ---------------------------------------------------


class _Apps:
    def __init__(self, view: View) -> None:
        self._view = view

    def replace(self, items: list[Item[App]], revision: int) -> None:
        apps = self._view.apps
        listed = {item.value.name for item in items}
        for name in [n for n, app in apps.items() if n not in listed and app.revision <= revision]:
            del apps[name]
        for item in items:
            self._view.apply_app(item)

    def put(self, item: Item[App]) -> None:
        self._view.apply_app(item)

    def delete(self, key: str, revision: int) -> None:
        name = keys.name_in(key, keys.APPS)
        app = self._view.apps.get(name)
        if app is not None and app.revision < revision:
            del self._view.apps[name]


class _Pools:
    def __init__(self, view: View) -> None:
        self._view = view

    def replace(self, items: list[Item[Pool]], revision: int) -> None:
        pools = self._view.pools
        listed = {item.value.name for item in items}
        gone = [n for n in pools if n not in listed]
        for name in [n for n in gone if pools[n].item.revision <= revision]:
            self._view.remove_pool(name)
        for item in items:
            self._view.apply_pool(item)

    def put(self, item: Item[Pool]) -> None:
        self._view.apply_pool(item)

    def delete(self, key: str, revision: int) -> None:
        name = keys.name_in(key, keys.POOLS)
        pool = self._view.pools.get(name)
        if pool is not None and pool.item.revision < revision:
            self._view.remove_pool(name)


class _Sandboxes:
    def __init__(self, view: View) -> None:
        self._view = view

    def replace(self, items: list[Item[Sandbox]], revision: int) -> None:
        sandboxes = self._view.sandboxes
        listed = {item.value.id for item in items}
        for sandbox_id in [
            s for s, item in sandboxes.items() if s not in listed and item.revision <= revision
        ]:
            self._view.remove_sandbox(sandbox_id)
        for item in items:
            self._view.apply_sandbox(item)

    def put(self, item: Item[Sandbox]) -> None:
        self._view.apply_sandbox(item)

    def delete(self, key: str, revision: int) -> None:
        sandbox_id = keys.name_in(key, keys.SANDBOXES)
        sandbox = self._view.sandboxes.get(sandbox_id)
        if sandbox is not None and sandbox.revision < revision:
            self._view.remove_sandbox(sandbox_id)
