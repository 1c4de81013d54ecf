"""Graceful shutdown: readiness fails, new connections are refused, in-flight requests
finish, cached leases go back to the activator."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.ingress import held, sandbox
from tests.support.waiting import eventually
from wakeful.activator.client import InProcessLeases
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.models import App, AppSpec, Concurrency, Pool, SandboxStatus
from wakeful.ingress import Ingress, IngressSettings
from wakeful.store import open_store

pytestmark = pytest.mark.anyio


async def test_shutdown_drains_in_flight_requests_and_releases_cached_leases(
    hello: Callable[[], int],
) -> None:
    async with open_store("memory://") as store:
        spec = AppSpec(command=["serve"], concurrency=Concurrency(requests_per_instance=10))
        await store.put("apps/hello", App(name="hello", active_version="v1"))
        await store.put(
            "pools/hello-v1", Pool(name="hello-v1", app="hello", version="v1", spec=spec)
        )
        for sandbox_id in ("sb-1", "sb-2"):
            await store.put(
                f"sandboxes/{sandbox_id}", sandbox(sandbox_id, hello(), SandboxStatus.RUNNING)
            )
        registry = CollectorRegistry()
        activator = Activator(store, ActivatorSettings(store_url="memory://", token="t"), registry)
        settings = IngressSettings(
            store_url="memory://", listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
        )
        ingress = Ingress(settings, InProcessLeases(activator), store, registry)
        stop, stopped = anyio.Event(), anyio.Event()

        async def run() -> None:
            async with ingress.running():
                await stop.wait()
            stopped.set()

        answers: list[httpx.Response] = []
        async with activator.running(), anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually(lambda: ingress.address[1] != 0)
            proxy = "http://{}:{}".format(*ingress.address)
            admin = "http://{}:{}".format(*ingress.admin_address)
            host = {"Host": "hello.localhost"}
            async with httpx.AsyncClient(headers=host) as client:
                assert (await client.get(f"{admin}/readyz")).status_code == 200
                assert (await client.get(f"{proxy}/")).status_code == 200  # a cached lease
                assert (await client.get(f"{proxy}/metrics")).status_code == 200  # the app's

                release = anyio.Event()

                async def slow() -> None:
                    async with httpx.AsyncClient(base_url=proxy, headers=host) as own:
                        answers.append(await held(own, release))

                tg.start_soon(slow)
                in_flight = {"app": "hello"}
                await eventually(
                    lambda: (
                        registry.get_sample_value("wakeful_ingress_requests_in_flight", in_flight)
                        == 1
                    )
                )
                assert activator.snapshot()[0].leased >= 1
                stop.set()
                await eventually(lambda: not ingress.ready)
                assert (await client.get(f"{admin}/readyz")).status_code == 503
                with pytest.raises(httpx.ConnectError):
                    async with httpx.AsyncClient(headers=host) as fresh:
                        await fresh.get(f"{proxy}/")
                assert answers == []  # still running, until the test lets it end
                release.set()
                await stopped.wait()
            assert answers == [200]
            assert activator.snapshot()[0].leased == 0
