"""The activator's watched view of apps, pools and sandboxes.

Theory of operation:
- The view is the only consumer of the store watch (`follow`). It is written by that task, and
  by the scale-up and activity writers applying what they wrote or re-read; every write takes
  only a revision newer than the cached one (invariant 5). After a `Resync` it re-lists and
  refreshes whatever the store has moved past.
- The request path reads it synchronously (`resolve`, `candidates`) and never awaits while
  holding what it read.
- What the rest of the activator must do about a change (wake a pool's waiters, drop the
  leases on a sandbox that left) it is told through `ViewListener`, in the same step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from wakeful.activator import decisions
from wakeful.domain import keys
from wakeful.domain.leases import UnknownApp
from wakeful.domain.models import GONE, SIZED, App, Pool, Sandbox, SandboxStatus
from wakeful.store import CorruptValue, Event, Item, Resync, Store, StoreError

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

    async def resync(self) -> int:
        """Re-list everything, refresh what the store has moved past, wake every waiter.

        Returns the revision to watch from, minus one.
        """
        apps = await self._store.list(keys.APPS, App)
        pools = await self._store.list(keys.POOLS, Pool)
        sandboxes = await self._store.list(keys.SANDBOXES, Sandbox)
        app_names = {a.value.name for a in apps.items}
        for name in [n for n in self.apps if n not in app_names]:
            if self.apps[name].revision <= apps.revision:
                del self.apps[name]
        for app in apps.items:
            self.apply_app(app)
        pool_items = {p.value.name: p for p in pools.items}
        for name in [n for n in self.pools if n not in pool_items]:
            if self.pools[name].item.revision <= pools.revision:
                self.remove_pool(name)
        for item in pools.items:
            self.apply_pool(item)
        listed = {s.value.id for s in sandboxes.items}
        for sandbox_id in [s for s in self.sandboxes if s not in listed]:
            if self.sandboxes[sandbox_id].revision <= sandboxes.revision:
                self.remove_sandbox(sandbox_id)
        for sandbox in sandboxes.items:
            self.apply_sandbox(sandbox)
        self.synced.set()
        self._listener.relisted()
        return min(apps.revision, pools.revision, sandboxes.revision)

    async def follow(self) -> None:
        """List, then apply watch events; list again after a `Resync` or a store error."""
        while True:
            try:
                revision = await self.resync()
                async for change in self._store.watch("", revision + 1):
                    if isinstance(change, Resync):
                        log.warning("store watch lost continuity (%s); re-listing", change.reason)
                        break
                    self.apply_event(change)
            except StoreError as exc:
                log.warning("store unavailable for the activator's view: %s", exc)
                await anyio.sleep(1)

    def apply_event(self, event: Event) -> None:
        key = event.key
        deleted = event.kind == "delete"
        try:
            if key.startswith(keys.APPS):
                name = keys.name_in(key, keys.APPS)
                if not deleted:
                    self.apply_app(Item(key, event.decode(App), event.revision))
                elif (app := self.apps.get(name)) is not None and app.revision < event.revision:
                    del self.apps[name]
            elif key.startswith(keys.POOLS):
                name = keys.name_in(key, keys.POOLS)
                if not deleted:
                    self.apply_pool(Item(key, event.decode(Pool), event.revision))
                elif (pool := self.pools.get(name)) is not None and (
                    pool.item.revision < event.revision
                ):
                    self.remove_pool(name)
            elif key.startswith(keys.SANDBOXES):
                name = keys.name_in(key, keys.SANDBOXES)
                if not deleted:
                    self.apply_sandbox(Item(key, event.decode(Sandbox), event.revision))
                elif (sandbox := self.sandboxes.get(name)) is not None and (
                    sandbox.revision < event.revision
                ):
                    self.remove_sandbox(name)
        except CorruptValue as exc:
            log.error("ignoring an invalid value in the store: %s", exc)

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
