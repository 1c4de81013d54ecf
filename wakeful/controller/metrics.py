"""What the pool controller shows of evacuations and of dial-out nodes' tunnels.

`EvacuationMetrics` is written by the reconciler as it plans and acts. `TunnelCollector`
reads the node records from its mirror when scraped: a node behind NAT cannot be scraped, the
control plane can (seed 003).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .mirror import Mirror


class EvacuationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.evacuating = Gauge(
            "wakeful_node_evacuating",
            "1 while a node is drained with evacuation and still holds sandboxes or state",
            ["node"],
            registry=registry,
        )
        self.evacuations = Counter(
            "wakeful_node_evacuations_total",
            "Stateful sandboxes moved off an evacuating node (moved), or whose state its node "
            "had to keep (failed)",
            ["result"],
            registry=registry,
        )
        self.conflicts = Counter(
            "wakeful_node_release_conflicts_total",
            "Adoptions of a state refused because another writer moved it first (stale epoch)",
            registry=registry,
        )
        self._seen: set[str] = set()

    def observe(self, evacuating: set[str]) -> None:
        """`evacuating`: the nodes drained with evacuation that still hold something."""
        for node in self._seen | evacuating:
            self.evacuating.labels(node=node).set(1 if node in evacuating else 0)
        self._seen |= evacuating


class TunnelCollector(Collector):
    """Dial-out nodes' streams and coverage actions, from the coverage tables they publish in
    their records (seed 003): a node behind NAT cannot be scraped, the control plane can."""

    def __init__(self, mirror: Callable[[], Mirror | None]) -> None:
        self._mirror = mirror

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "wakeful_node_tunnel_streams",
            "A dial-out node's tunnel streams on each ingress replica, by state (idle, busy), "
            "as its last coverage tick saw them",
            labels=["node", "replica", "state"],
        )
        coverage = GaugeMetricFamily(
            "wakeful_node_tunnel_coverage",
            "1 for a dial-out node's coverage state on each ingress replica (covered, growing, "
            "filling, overdue, evacuated)",
            labels=["node", "replica", "state"],
        )
        reachable = GaugeMetricFamily(
            "wakeful_node_tunnel_reachable",
            "1 while a dial-out node holds a tunnel stream on some ingress replica",
            labels=["node"],
        )
        actions = CounterMetricFamily(
            "wakeful_node_tunnel_coverage_actions",
            "Streams a dial-out node opened or closed, by coverage action (grow, fill, "
            "evacuate, recycle, prune, cap), since its agent started",
            labels=["node", "action"],
        )
        mirror = self._mirror()
        for item in [] if mirror is None else list(mirror.nodes.items.values()):
            node, tunnel = item.value.name, item.value.tunnel
            if tunnel is None:
                continue
            reachable.add_metric([node], 1 if tunnel.reachable else 0)
            for replica in tunnel.replicas:
                streams.add_metric([node, replica.replica, "busy"], replica.busy)
                idle = max(0, replica.streams - replica.busy)
                streams.add_metric([node, replica.replica, "idle"], idle)
                coverage.add_metric([node, replica.replica, replica.state], 1)
            for action, count in sorted(tunnel.actions.items()):
                actions.add_metric([node, action], count)
        yield from (streams, coverage, reachable, actions)
