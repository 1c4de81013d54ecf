"""What a replica counts of its tunnels, and the collector that shows it on `/metrics`:
streams by node and state, requests by path (local, relayed, relayed_in, unreachable), and
streams refused at the cap."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wakeful.ingress.nodestreams.hub import StreamHub


@dataclass
class TunnelCounts:
    local: int = 0
    relayed: int = 0
    relayed_in: int = 0
    unreachable: int = 0
    refused_streams: int = 0


class TunnelCollector(Collector):
    def __init__(self, hub: StreamHub, counts: TunnelCounts) -> None:
        self._hub = hub
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "wakeful_ingress_tunnel_streams",
            "Streams dial-out nodes hold on this replica, by node and state (idle, busy)",
            labels=["node", "state"],
        )
        for node, total, idle in self._hub.counts():
            streams.add_metric([node, "idle"], idle)
            streams.add_metric([node, "busy"], total - idle)
        yield streams
        counts = self._counts
        requests = CounterMetricFamily(
            "wakeful_ingress_tunnel_requests",
            "Requests for tunnelled nodes' sandboxes, by path: on a stream here (local), "
            "relayed to the replica holding one (relayed), relayed here by a peer "
            "(relayed_in), or for a node with no stream anywhere (unreachable)",
            labels=["path"],
        )
        requests.add_metric(["local"], counts.local)
        requests.add_metric(["relayed"], counts.relayed)
        requests.add_metric(["relayed_in"], counts.relayed_in)
        requests.add_metric(["unreachable"], counts.unreachable)
        yield requests
        refused = CounterMetricFamily(
            "wakeful_ingress_tunnel_streams_refused",
            "Streams refused because their node held the cap of streams on this replica",
        )
        refused.add_metric([], counts.refused_streams)
        yield refused
