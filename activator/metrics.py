from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ActivatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._pool_gauges: dict[str, tuple[Gauge, Gauge, Gauge]] = {}
        self.leases = Gauge(
            "wakeful_activator_leases",
            "Leases held, by pool and kind (normal or overflow)",
            ["pool", "kind"],
            registry=registry,
        )
        self.waiters = Gauge(
            "wakeful_activator_waiters",
            "Requests parked because nothing in their pool is routable",
            ["pool"],
            registry=registry,
        )
        self.overflow = Counter(
            "wakeful_activator_overflow_admissions_total",
            "Requests admitted over target on an overflow lease",
            ["pool"],
            registry=registry,
        )
        self.scale_ups = Counter(
            "wakeful_activator_scale_ups_total",
            "Scale-up attempts by result: applied, conflict, capped, backoff, failed",
            ["pool", "result"],
            registry=registry,
        )
        self.wait = Histogram(
            "wakeful_activator_lease_wait_seconds",
            "Time from a lease request to its grant",
            buckets=(0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        )
        self.wake = Histogram(
            "wakeful_activator_wake_seconds",
            "Requests that waited for their app to wake (nothing of its pool was ready), by "
            "how it woke: thaw (a suspended sandbox) or start (a new one); their wait",
            ["kind"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.suspends = Counter(
            "wakeful_activator_suspends_total",
            "Idle sandboxes suspended, by result: applied, conflict, failed",
            ["pool", "result"],
            registry=registry,
        )
        self.thaws = Counter(
            "wakeful_activator_thaws_total",
            "Suspended sandboxes thawed for demand, by result: applied, conflict, failed",
            ["pool", "result"],
            registry=registry,
        )
        self.evictions = Counter(
            "wakeful_activator_suspended_evictions_total",
            "Suspended sandboxes stopped because their node's cap for suspended memory was "
            "passed (or it was under memory pressure)",
            ["pool"],
            registry=registry,
        )
        self.adopted = Counter(
            "wakeful_activator_adopted_leases_total",
            "Leases another activator granted, taken over from the ingresses holding them",
            registry=registry,
        )
        self.expired = Counter(
            "wakeful_activator_expired_leases_total",
            "Leases that expired unrenewed; their capacity returned",
            ["pool"],
            registry=registry,
        )

    def publish(self, pool: str, normal: int, overflow: int, waiters: int) -> None:
        """A pool's lease and waiter gauges, after every change to them."""
        gauges = self._pool_gauges.get(pool)
        if gauges is None:
            gauges = self._pool_gauges[pool] = (
                self.leases.labels(pool=pool, kind="normal"),
                self.leases.labels(pool=pool, kind="overflow"),
                self.waiters.labels(pool=pool),
            )
            # At 0 from the pool's first lease: `increase()` then counts its first expiry.
            self.expired.labels(pool=pool)
        gauges[0].set(normal)
        gauges[1].set(overflow)
        gauges[2].set(waiters)

    def forget_pool(self, pool: str) -> None:
        """Stop exporting a pool that no longer exists."""
        self._pool_gauges.pop(pool, None)
        for labels, gauge in [
            ((pool, "normal"), self.leases),
            ((pool, "overflow"), self.leases),
            ((pool,), self.waiters),
        ]:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
