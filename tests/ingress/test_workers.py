"""The workers' supervisor (`ingress.workers`): each worker's settings, the merged metrics, the
kept port, a worker that cannot start. The workers serving together, one killed and started
again, all stopped as one: tests/e2e/test_ingress_workers.py."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterable

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from wakeful.ingress.settings import IngressSettings
from wakeful.ingress.workers import labelled, reserve, shifted, supervise, worker_env
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio


def test_each_worker_is_a_replica_with_its_own_tunnel_port_and_name() -> None:
    settings = IngressSettings(
        tunnel_listen="0.0.0.0:9000", tunnel_advertise="ingress-a.internal:9000"
    )
    envs = [
        worker_env(
            settings, i, listen="0.0.0.0:8080", tls_listen=None, admin="127.0.0.1:41", replica="a"
        )
        for i in range(3)
    ]
    assert [e["WAKEFUL_TUNNEL_REPLICA"] for e in envs] == ["a-w0", "a-w1", "a-w2"]
    assert [e["WAKEFUL_TUNNEL_LISTEN"] for e in envs] == [
        "0.0.0.0:9000",
        "0.0.0.0:9001",
        "0.0.0.0:9002",
    ]
    assert envs[2]["WAKEFUL_TUNNEL_ADVERTISE"] == "ingress-a.internal:9002"
    assert {e["WAKEFUL_LISTEN"] for e in envs} == {"0.0.0.0:8080"}  # shared
    assert [e["WAKEFUL_INGRESS_WORKER"] for e in envs] == ["0", "1", "2"]
    assert {e["WAKEFUL_INGRESS_WORKERS"] for e in envs} == {"1"}  # a worker never forks more
    assert "WAKEFUL_TLS_LISTEN" not in envs[0]
    assert shifted("[::1]:0", 4) == "[::1]:0"  # each its own free port
    assert shifted("[::1]:443", 1) == "[::1]:444"


def test_a_worker_count_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="must be 1 to 256 or 'auto'"):
        IngressSettings(ingress_workers=0)
    assert IngressSettings(ingress_workers="auto").workers >= 1
    assert IngressSettings(ingress_workers="3").workers == 3  # as WAKEFUL_INGRESS_WORKERS=3


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def test_metrics_of_every_worker_merge_with_a_worker_label() -> None:
    one = (
        "# HELP wakeful_ingress_requests_total Requests answered\n"
        "# TYPE wakeful_ingress_requests_total counter\n"
        'wakeful_ingress_requests_total{app="hello",status_class="2xx"} 5.0\n'
    )
    two = one.replace("5.0", "7.0")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(labelled([(0, one), (1, two), (2, "not { metrics")])))
    text = generate_latest(registry).decode()
    [family] = text_string_to_metric_families(text)  # one family, not one per worker
    got = {s.labels["worker"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert got == {"0": 5.0, "1": 7.0}


def test_the_port_is_kept_for_the_workers_and_taken_by_nobody_else() -> None:
    port = free_port()
    with reserve(f"127.0.0.1:{port}", "listen address") as held:
        assert held.getsockname()[1] == port
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("127.0.0.1", port))  # without SO_REUSEPORT: refused
        with socket.socket() as probe:
            probe.settimeout(2)
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # bound, not listening


async def test_a_worker_that_never_becomes_ready_stops_them_all_with_the_reason() -> None:
    settings = IngressSettings(
        listen=f"127.0.0.1:{free_port()}",
        admin_listen=f"127.0.0.1:{free_port()}",
        ingress_workers=2,
    )
    told: list[str] = []
    with anyio.fail_after(30):
        why = await supervise(
            settings,
            announce=told.append,
            wait_for_stop=anyio.Event().wait,
            command=[sys.executable, "-c", "import sys; sys.exit(3)"],
        )
    assert why is not None
    assert "exited with status 3 before it was ready" in why
    assert told == []  # never announced as listening
