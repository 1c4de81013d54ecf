"""What an operator alerts on, as the control plane sees it: pools that crash at boot, nodes
that registered once and are gone, and whether the store answers.

`CrashCollector` reads the pool records from the pool controller's mirror when scraped (the
controller counts boot crashes into them). `StoreProbe` lists `seen/` and `nodes/` every few
seconds: a read cheap enough to repeat, which says both whether the store answers and which
nodes that ever registered hold no registration now (their agent stopped, or lost the store
for longer than its TTL).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import anyio
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wakeful.domain import keys
from wakeful.domain.models import Node, SeenNode
from wakeful.store import Store, StoreError

if TYPE_CHECKING:
    from .mirror import Mirror

log = logging.getLogger(__name__)


class CrashCollector(Collector):
    """Boot crashes of the pools that take traffic, from the pool controller's mirror (None
    before its first listing: nothing is reported). `clock`: the wall clock the cooldowns
    were written in."""

    def __init__(
        self, mirror: Callable[[], Mirror | None], clock: Callable[[], float] = time.time
    ) -> None:
        self._mirror = mirror
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            "wakeful_pool_crash_count",
            "Sandboxes of the pool that died while booting, in a row (0 once one serves)",
            labels=["app", "pool"],
        )
        cooling = GaugeMetricFamily(
            "wakeful_pool_crash_cooldown",
            "1 while the pool waits out a crash cooldown: no sandbox starts, requests get 503",
            labels=["app", "pool"],
        )
        mirror = self._mirror()
        now = self._clock()
        for item in [] if mirror is None else list(mirror.pools.items.values()):
            pool = item.value
            if pool.retired or pool.deleted:
                continue
            count.add_metric([pool.app, pool.name], pool.crash_count)
            cooling.add_metric([pool.app, pool.name], 1 if pool.crash_cooldown_until > now else 0)
        yield from (count, cooling)


class StoreProbe(Collector):
    """Lists `seen/` and `nodes/` every `interval` seconds, each time within `timeout`.

    A listing that fails or takes too long reports the store down until one succeeds; the
    loop itself never ends on a store error. Node registrations are as the last listing that
    succeeded found them."""

    def __init__(
        self,
        store: Store,
        *,
        interval: float = 5.0,
        timeout: float = 3.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self.up: bool | None = None
        """None until the first probe has ended."""
        self.last_success = 0.0
        """Wall-clock time the last successful probe ended (0: never)."""
        self.seen: frozenset[str] = frozenset()
        self.registered: frozenset[str] = frozenset()

    async def run(self) -> None:
        while True:
            await self.probe()
            await anyio.sleep(self._interval)

    async def probe(self) -> bool:
        """One probe; whether the store answered in time."""
        try:
            with anyio.fail_after(self._timeout):
                seen = await self._store.list(keys.SEEN, SeenNode)
                nodes = await self._store.list(keys.NODES, Node)
        except (StoreError, TimeoutError) as exc:
            if self.up is not False:
                log.warning("the store does not answer: %s", str(exc) or type(exc).__name__)
            self.up = False
            return False
        if self.up is False:
            log.info("the store answers again")
        # By key: a record that does not validate (a newer wakeful's) is still a node.
        self.seen = _names(keys.SEEN, [i.key for i in seen.items] + list(seen.invalid))
        self.registered = _names(keys.NODES, [i.key for i in nodes.items] + list(nodes.invalid))
        self.up = True
        self.last_success = self._clock()
        return True

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "wakeful_store_up",
            "1 when the control plane's last probe of the store (a listing) answered in time",
        )
        last = GaugeMetricFamily(
            "wakeful_store_last_success_timestamp_seconds",
            "When the control plane's last successful probe of the store ended",
        )
        registered = GaugeMetricFamily(
            "wakeful_node_registered",
            "1 while a node that ever registered holds its registration (nodes/, TTL-bound); "
            "0 when its agent stopped or lost the store for longer than the TTL",
            labels=["node"],
        )
        if self.up is not None:
            up.add_metric([], 1 if self.up else 0)
        if self.last_success:
            last.add_metric([], self.last_success)
        for node in sorted(self.seen | self.registered):
            registered.add_metric([node], 1 if node in self.registered else 0)
        yield from (up, last, registered)


def _names(prefix: str, found: list[str]) -> frozenset[str]:
    return frozenset(key.removeprefix(prefix) for key in found)


def leading_gauge(registry: CollectorRegistry) -> Gauge:
    """`wakeful_activator_leading`: 1 on the control plane that leads, 0 on a standby (whose
    /metrics exports its own store probe beside it), so "no activator leads" is an alert."""
    return Gauge(
        "wakeful_activator_leading",
        "1 on the activator that leads (runs the control plane), 0 on a standby",
        registry=registry,
    )
