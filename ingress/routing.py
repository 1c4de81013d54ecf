"""Host → app. A pure matcher over an immutable index, and the table that keeps it current.

Only the reflection of `apps/` writes the table (`wakeful.store.reflector`); the request path
reads `table.index`, a snapshot replaced whole, so it never sees half an update.
Precedence: `<app>.<base_domain>` for an app with its default host, then an exact host, then
the longest matching `*.domain`. So no app's `hosts` can take another app's default host,
whatever base domain an ingress uses. The control plane refuses at deploy what would clash
(`wakeful.domain.hosts`): overlaps between apps' `hosts`, and hosts overlapping a default host
under its own `WAKEFUL_BASE_DOMAIN`, which must be the ingresses'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import anyio

from wakeful.domain import keys
from wakeful.domain.models import App
from wakeful.store import Item, Store
from wakeful.store.reflector import reflect

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouteIndex:
    exact: Mapping[str, str] = field(default_factory=dict)
    wildcard: Mapping[str, str] = field(default_factory=dict)
    """`example.com` → app, for a `*.example.com` host."""
    apps: frozenset[str] = frozenset()
    """The apps `<app>.<base_domain>` routes to (`default_host`)."""


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
        if app.default_host:
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
    label, _, domain = host.partition(".")
    if domain == base_domain and label in index.apps:
        return label
    found = index.exact.get(host)
    if found is not None:
        return found
    rest = host
    while "." in rest:
        rest = rest.partition(".")[2]
        found = index.wildcard.get(rest)
        if found is not None:
            return found
    return None


ROUTE_MEMORY = 4096
"""Host header values a `Router` remembers the app of."""
MAX_HOST_REMEMBERED = 270
"""Longer Host values (no host name is: 253 bytes, then a port) are routed, not remembered."""


class Router:
    """Host header → app, remembered per header value while the index stays the same (the
    index is replaced whole on every change, so a new one empties the memory). Bounded: a
    client sending a new Host each time only empties it, and a Host longer than any name is
    never kept."""

    def __init__(self, index: Callable[[], RouteIndex], base_domain: str) -> None:
        self._index = index
        self._base_domain = base_domain
        self._routed: dict[str, str] = {}
        """Host header → app ("" for none), for `_routed_by`."""
        self._routed_by: RouteIndex | None = None

    def app_for(self, host_header: str) -> str | None:
        index = self._index()
        if index is not self._routed_by:
            self._routed.clear()
            self._routed_by = index
        app = self._routed.get(host_header)
        if app is None:
            app = match(index, normalize_host(host_header), self._base_domain) or ""
            if len(host_header) <= MAX_HOST_REMEMBERED:
                if len(self._routed) >= ROUTE_MEMORY:
                    self._routed.clear()
                self._routed[host_header] = app
        return app or None

    def __len__(self) -> int:
        """Host values remembered."""
        return len(self._routed)


class RoutingTable:
    """The routing index, kept current by `run` (a reflection of `apps/`)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._apps: dict[str, Item[App]] = {}
        self.index = RouteIndex()
        self.synced = anyio.Event()
        self._changed = anyio.Event()

    async def run(self) -> None:
        """Keep the index current until cancelled."""
        await reflect(self._store, keys.APPS, App, self, what="routing table")

    def replace(self, items: list[Item[App]], revision: int) -> None:
        self._apps = {item.value.name: item for item in items}
        self._publish()
        self.synced.set()

    def put(self, item: Item[App]) -> None:
        cached = self._apps.get(item.value.name)
        if cached is None or cached.revision < item.revision:
            self._apps[item.value.name] = item
            self._publish()

    def delete(self, key: str, revision: int) -> None:
        if self._apps.pop(keys.name_in(key, keys.APPS), None) is not None:
            self._publish()

    async def wait_for(self, app: str) -> None:
        """Until `app` is in the index (a deploy written to the store has reached it)."""
        while app not in self._apps:
            await self._changed.wait()

    def _publish(self) -> None:
        self.index = build_index(item.value for item in self._apps.values())
        self._changed.set()
        self._changed = anyio.Event()
