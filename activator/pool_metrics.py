"""Each pool as `wakeful status` shows it, as metrics: read from the activator when scraped.

The activator's own gauges (`wakeful_activator_leases`, `wakeful_activator_waiters`) are kept
as leases move and name the pool only; these carry the app, so a dashboard or an alert can
sum an app's pools (a deploy runs two for a while) and filter by app.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wakeful.activator.reporting import PoolSnapshot


class PoolCollector(Collector):
    """`snapshot`: every pool as the activator sees it now (`Activator.snapshot`)."""

    def __init__(self, snapshot: Callable[[], Iterable[PoolSnapshot]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        labels = ["app", "pool"]
        info = GaugeMetricFamily(
            "wakeful_pool_info",
            "1 for each pool, with its version and state (active, draining, retired)",
            labels=["app", "pool", "version", "state"],
        )
        desired = GaugeMetricFamily(
            "wakeful_pool_desired_instances",
            "Sandboxes the pool controller keeps the pool at (0 for a retired pool)",
            labels=labels,
        )
        live = GaugeMetricFamily(
            "wakeful_pool_live_sandboxes",
            "Sandboxes counted in the pool's size: pending, booting, running or suspended",
            labels=labels,
        )
        ready = GaugeMetricFamily(
            "wakeful_pool_ready_sandboxes",
            "Sandboxes that take requests (running, passed their health check)",
            labels=labels,
        )
        suspended = GaugeMetricFamily(
            "wakeful_pool_suspended_sandboxes",
            "Sandboxes frozen while idle (counted in live): they wake in milliseconds",
            labels=labels,
        )
        leased = GaugeMetricFamily(
            "wakeful_pool_leased",
            "Capacity (requests) leased on the pool's sandboxes, overflow leases included",
            labels=labels,
        )
        overflow = GaugeMetricFamily(
            "wakeful_pool_overflow_leases",
            "Leases admitted over the pool's target (requests_per_instance per sandbox)",
            labels=labels,
        )
        waiters = GaugeMetricFamily(
            "wakeful_pool_waiters",
            "Requests parked at the activator until a sandbox of the pool is ready",
            labels=labels,
        )
        for pool in self._snapshot():
            key = [pool.app, pool.pool]
            info.add_metric([pool.app, pool.pool, pool.version, pool.state], 1)
            desired.add_metric(key, pool.desired_instances)
            live.add_metric(key, pool.live)
            ready.add_metric(key, pool.ready)
            suspended.add_metric(key, pool.suspended)
            leased.add_metric(key, pool.leased)
            overflow.add_metric(key, pool.overflow)
            waiters.add_metric(key, pool.waiters)
        yield from (info, desired, live, ready, suspended, leased, overflow, waiters)
