"""What a standby activator answers (`wakeful.activator.standby.StandbyApp`): its health and
its own metrics; 503 naming the leader for everything else."""

from __future__ import annotations

import httpx
import pytest

from wakeful.activator.standby import StandbyApp
from wakeful.domain.models import Leader

pytestmark = pytest.mark.anyio


async def test_a_standby_answers_health_and_its_metrics_and_names_the_leader() -> None:
    async def leader() -> Leader:
        return Leader(holder="a1", url="http://10.0.0.1:8082")

    app = StandbyApp(leader, metrics=lambda: b"wakeful_activator_leading 0.0\n")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://standby"
    ) as http:
        assert (await http.get("/healthz")).status_code == 200
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and metrics.text == "wakeful_activator_leading 0.0\n"
        assert metrics.headers["content-type"].startswith("text/plain")
        refused = await http.get("/v1/pools")
        assert refused.status_code == 503 and refused.json()["leader"] == "http://10.0.0.1:8082"
    bare = StandbyApp(leader)  # no metrics given: /metrics is like any other route
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=bare), base_url="http://standby"
    ) as http:
        assert (await http.get("/metrics")).status_code == 503
