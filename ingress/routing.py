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
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import anyio

from wakeful.domain import keys
from wakeful.domain.models import App
from wakeful.domain.split import Spread
from wakeful.ingress.errors import BadRequest
from wakeful.store import Item, Store
from wakeful.store.reflector import reflect

log = logging.getLogger(__name__)


Route = tuple[str, str | None, bool]
"""(app, version, counted): the version a tag, the app's split or its active version names
(None: an app with no version yet, which the activator refuses), and whether its answers are
counted per version (the app has a split or tags: the only apps the activator keeps versions'
figures of, so that no other request pays for them)."""


class SplitRoutes:
    """An app's split as routes, in the order of its spread's period (`Spread.sequence`):
    each request takes the next, built once per index so a pick allocates nothing."""

    __slots__ = ("_next", "_routes")

    def __init__(self, app: str, spread: Spread) -> None:
        self._routes: tuple[Route, ...] = tuple((app, v, True) for v in spread.sequence)
        self._next = 0

    def pick(self) -> Route:
        at = self._next
        self._next = at + 1 if at + 1 < len(self._routes) else 0
        return self._routes[at]


@dataclass(frozen=True, slots=True)
class RouteIndex:
    exact: Mapping[str, str] = field(default_factory=dict)
    wildcard: Mapping[str, str] = field(default_factory=dict)
    """`example.com` → app, for a `*.example.com` host."""
    apps: frozenset[str] = frozenset()
    """The apps `<app>.<base_domain>` routes to (`default_host`)."""
    tagged: Mapping[str, Route] = field(default_factory=dict)
    """`TAG--APP` → its route: the first label of a tag's host under the base domain."""
    splits: Mapping[str, SplitRoutes] = field(default_factory=dict)
    """App → the even spread of its split (apps with one)."""
    counted: frozenset[str] = frozenset()
    """Apps with a split or tags: their answers are counted per version (`Route`)."""
    active: Mapping[str, str] = field(default_factory=dict)
    """App → its active version: what a request for it names when no split or tag chooses.
    Named, not left to the activator, so that the ingress's cached leases for an app are
    keyed by the version they are on: when the active version changes while the old one
    still serves (a tag, a split's end), no request follows a lease cached for the old one."""


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
    tagged: dict[str, Route] = {}
    splits: dict[str, SplitRoutes] = {}
    active: dict[str, str] = {}
    apps = sorted(apps, key=lambda a: a.name)
    for app in apps:
        if app.active_version is not None:
            active[app.name] = app.active_version
        if app.default_host:
            names.add(app.name)
        for tag, version in app.tags.items():
            tagged[f"{tag}--{app.name}"] = (app.name, version, True)
        if app.split:
            splits[app.name] = SplitRoutes(app.name, Spread(app.split))
        for host in app.hosts:
            host = host.casefold()
            table, key = (wildcard, host[2:]) if host.startswith("*.") else (exact, host)
            if key in table and table[key] != app.name:
                log.warning("host %s is claimed by %s and %s", host, table[key], app.name)
                continue
            table[key] = app.name
    counted = frozenset(app.name for app in apps if app.split or app.tags)
    return RouteIndex(exact, wildcard, frozenset(names), tagged, splits, counted, active)


def find(index: RouteIndex, host: str, base_domain: str) -> tuple[Route, SplitRoutes | None] | None:
    """The app serving `host` (already normalized) with the version it names (a tag's, or
    the active one), and the app's split unless a tag chose; None when nothing serves it.
    An app's own `<app>.<base_domain>` comes before any tag's reading of it."""
    app = match(index, host, base_domain)
    if app is not None:
        return (app, index.active.get(app), app in index.counted), index.splits.get(app)
    label, _, domain = host.partition(".")
    if domain == base_domain and "--" in label:
        tagged = index.tagged.get(label)
        if tagged is not None:
            return tagged, None
    return None


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


ROUTE_MEMORY: Final = 4096
"""Host header values a `Router` remembers the app of."""
MAX_HOST: Final = 270
"""Longer Host values are refused: no host name is (253 bytes, then a port)."""
_HOST: Final = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?")
"""A Host value's shape (RFC 9110 §7.2, RFC 3986 §3.2.2): an IP literal or a name of the
characters a URI's host may hold, then a port; empty is one too (an HTTP/1.0 request's)."""


def valid_host(host_header: str) -> bool:
    """Whether a Host value is one: RFC 9112 §3.2 has a server answer 400 to one that is not.
    Checked before anything reads it: a value the router would case-fold out of ASCII, or a
    `#` or `/` in it, went into the Location of an HTTPS redirect, and one of 16,000 labels
    cost the wildcard lookup 100 ms of the loop (a hostile tester's finds)."""
    return len(host_header) <= MAX_HOST and _HOST.fullmatch(host_header) is not None


_NOWHERE: Final[tuple[Route, SplitRoutes | None]] = (("", None, False), None)


class Router:
    """Host header → (app, version), remembered per header value while the index stays the
    same (the index is replaced whole on every change, so a new one empties the memory).
    Bounded: a client sending a new Host each time only empties it. A value that is no host
    (`valid_host`) is a BadRequest, never looked up or kept. An app with a split gets its
    version from the split's even spread, request by request (`wakeful.domain.split.Spread`);
    a tag's host names its own."""

    def __init__(self, index: Callable[[], RouteIndex], base_domain: str) -> None:
        self._index = index
        self._base_domain = base_domain
        self._routed: dict[str, tuple[Route, SplitRoutes | None]] = {}
        """Host header → `find`'s answer (`_NOWHERE` for none), for `_routed_by`."""
        self._routed_by: RouteIndex | None = None

    def route(self, host_header: str) -> Route | None:
        index = self._index()
        if index is not self._routed_by:
            self._routed.clear()
            self._routed_by = index
        found = self._routed.get(host_header)
        if found is None:
            if not valid_host(host_header):
                raise BadRequest(f"the Host {host_header[:80]!r} is not a host")
            found = find(index, normalize_host(host_header), self._base_domain) or _NOWHERE
            if len(self._routed) >= ROUTE_MEMORY:
                self._routed.clear()
            self._routed[host_header] = found
        route, split = found
        if split is not None:
            return split.pick()
        return route if route[0] else None

    def app_for(self, host_header: str) -> str | None:
        """The app alone (`route`)."""
        route = self.route(host_header)
        return route[0] if route is not None else None

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
        self.revision = 0
        """The store revision the index has followed `apps/` to (a write to an app at this
        revision or before is in it)."""

    async def run(self) -> None:
        """Keep the index current until cancelled."""
        await reflect(self._store, keys.APPS, App, self, what="routing table")

    def replace(self, items: list[Item[App]], revision: int) -> None:
        self._apps = {item.value.name: item for item in items}
        self.revision = max(self.revision, revision)
        self._publish()
        self.synced.set()

    def put(self, item: Item[App]) -> None:
        cached = self._apps.get(item.value.name)
        self.revision = max(self.revision, item.revision)
        if cached is None or cached.revision < item.revision:
            self._apps[item.value.name] = item
            self._publish()

    def delete(self, key: str, revision: int) -> None:
        self.revision = max(self.revision, revision)
        if self._apps.pop(keys.name_in(key, keys.APPS), None) is not None:
            self._publish()

    async def changed(self) -> None:
        """Until the index changes next."""
        await self._changed.wait()

    async def wait_for(self, app: str) -> None:
        """Until `app` is in the index (a deploy written to the store has reached it)."""
        while app not in self._apps:
            await self._changed.wait()

    def _publish(self) -> None:
        self.index = build_index(item.value for item in self._apps.values())
        self._changed.set()
        self._changed = anyio.Event()
