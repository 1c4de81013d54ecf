"""Host → app. A pure matcher over an immutable index, and the table that keeps it current.

Only the sync task writes the table (from a watch of `apps/`, re-listing on `Resync`); the
request path reads `table.index`, a snapshot replaced whole, so it never sees half an update.
Precedence: an exact host, then the longest matching `*.domain`, then `<app>.<base_domain>`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import anyio

from wakeful.domain.models import App
from wakeful.store import CorruptValue, Item, Resync, Store, StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouteIndex:
    exact: Mapping[str, str] = field(default_factory=dict)
    wildcard: Mapping[str, str] = field(default_factory=dict)
    """`example.com` → app, for a `*.example.com` host."""
    apps: frozenset[str] = frozenset()


def normalize_host(raw: str) -> str:
    """The Host header without its port or trailing dot, case-folded (`[::1]:80` → `::1`)."""
    host = raw.strip()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".").casefold()


def build_index(apps: Iterable[App]) -> RouteIndex:
    """One index over every app; a host two apps claim goes to the first by name (logged)."""
    exact: dict[str, str] = {}
    wildcard: dict[str, str] = {}
    names: set[str] = set()
    for app in sorted(apps, key=lambda a: a.name):
        names.add(app.name)
        for host in app.hosts:
            host = host.casefold()
            table, key = (wildcard, host[2:]) if host.startswith("*.") else (exact, host)
            if key in table and table[key] != app.name:
                log.warning("host %s is claimed by %s and %s", host, table[key], app.name)
                continue
            table[key] = app.name
    return RouteIndex(exact, wildcard, frozenset(names))


def match(index: RouteIndex, host: str, base_domain: str) -> str | None:
    """The app serving `host` (already normalized), or None."""
    found = index.exact.get(host)
    if found is not None:
        return found
    rest = host
    while "." in rest:
        rest = rest.partition(".")[2]
        found = index.wildcard.get(rest)
        if found is not None:
            return found
    label, _, domain = host.partition(".")
    if domain == base_domain and label in index.apps:
        return label
    return None


class RoutingTable:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._apps: dict[str, Item[App]] = {}
        self.index = RouteIndex()
        self.synced = anyio.Event()

    async def resync(self) -> int:
        listing = await self._store.list("apps/", App)
        self._apps = {item.value.name: item for item in listing.items}
        self._publish()
        self.synced.set()
        return listing.revision

    async def run(self) -> None:
        """Keep the index current until cancelled."""
        while True:
            try:
                revision = await self.resync()
                async for change in self._store.watch("apps/", revision + 1):
                    if isinstance(change, Resync):
                        log.warning("apps watch lost continuity (%s); re-listing", change.reason)
                        break
                    name = change.key.partition("/")[2]
                    cached = self._apps.get(name)
                    if cached is not None and cached.revision >= change.revision:
                        continue
                    if change.kind == "delete":
                        self._apps.pop(name, None)
                    else:
                        try:
                            self._apps[name] = Item(change.key, change.decode(App), change.revision)
                        except CorruptValue as exc:
                            log.error("ignoring an invalid app record: %s", exc)
                            continue
                    self._publish()
            except StoreError as exc:
                log.warning("store unavailable for the routing table: %s", exc)
                await anyio.sleep(1)

    def _publish(self) -> None:
        self.index = build_index(item.value for item in self._apps.values())
