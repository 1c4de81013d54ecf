"""The activator's HTTP API and its client, over real HTTP through uvicorn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest

from tests.support.activator import (
    ACTIVATION_TIMEOUT,
    TOKEN,
    Served,
    nothing_routable,
)
from tests.support.waiting import eventually
from wakeful.activator.client import HttpLeases
from wakeful.domain.leases import LeaseGone, NoCapacity, Unauthorized, UnknownApp, Unreachable
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio


async def past_the_activation_timeout(
    api: Served, request: Callable[[], Awaitable[object]]
) -> None:
    """Run `request` until it is parked, then move the clock past its deadline."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(request)
            await eventually(lambda: api.activator.snapshot()[0].waiters == 1)
            api.clock.advance(ACTIVATION_TIMEOUT)
            api.activator.expire_leases()


async def test_leases_round_trip_through_the_http_client(api: Served) -> None:
    url = api.url
    leases = HttpLeases(url, TOKEN)
    try:
        grant = await leases.acquire("hello")
        assert (grant.sandbox_id, grant.url, grant.size, grant.overflow) == (
            "sb-1",
            "http://127.0.0.1:9000",
            2,
            False,
        )
        async with httpx.AsyncClient(base_url=url) as client:
            pools = await client.get("/v1/pools", headers={"Authorization": f"Bearer {TOKEN}"})
        assert pools.status_code == 200
        (report,) = pools.json()
        assert (report["pool"], report["leased"], report["ready"], report["waiters"]) == (
            "hello-v1",
            2,
            1,
            0,
        )
        renewed = await leases.renew(grant.lease_id, used=True)
        assert renewed.lease_id == grant.lease_id
        await leases.release(grant.lease_id)
        await leases.release(grant.lease_id)  # idempotent: 204 again
        with pytest.raises(LeaseGone):
            await leases.renew(grant.lease_id)
        with pytest.raises(UnknownApp):
            await leases.acquire("nope")
    finally:
        await leases.aclose()


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}],
    ids=["missing", "wrong-token", "not-bearer"],
)
async def test_the_lease_api_needs_the_bearer_token(api: Served, headers: dict[str, str]) -> None:
    url = api.url
    async with httpx.AsyncClient(base_url=url) as client:
        for answer in [
            await client.post("/v1/leases", json={"app": "hello"}, headers=headers),
            await client.get("/v1/pools", headers=headers),
            await client.delete("/v1/leases/x", headers=headers),
        ]:
            assert answer.status_code == 401
            assert answer.json()["error"] == "unauthorized"
    async with HttpLeases(url, "wrong") as leases:
        with pytest.raises(Unauthorized):
            await leases.acquire("hello")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body.app"),
        ({"app": "Not A Name"}, "body.app"),
        ({"app": "ok", "version": 3}, "body.version"),
        ({"app": "ok", "requests": 0}, "body.requests"),
        ({"app": "ok", "requests": 1001}, "body.requests"),
    ],
    ids=["missing-app", "bad-app-name", "version-not-a-string", "no-request", "too-many"],
)
async def test_malformed_requests_get_422_naming_the_field(
    api: Served, body: dict[str, object], field: str
) -> None:
    url = api.url
    async with httpx.AsyncClient(base_url=url) as client:
        answer = await client.post(
            "/v1/leases", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert answer.status_code == 422
    assert answer.json()["error"] == "invalid request"
    assert field in answer.json()["detail"]


async def test_no_capacity_in_time_is_503_with_retry_after(api: Served) -> None:
    await nothing_routable(api)
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=api.url) as client:

        async def ask() -> None:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            answers.append(await client.post("/v1/leases", json={"app": "hello"}, headers=headers))

        await past_the_activation_timeout(api, ask)
        metrics = await client.get("/metrics")
    (answer,) = answers
    assert answer.status_code == 503
    assert int(answer.headers["Retry-After"]) >= 1
    assert answer.json()["error"] == "no capacity"
    assert "wakeful_activator_lease_wait_seconds" in metrics.text
    refused: list[NoCapacity] = []
    async with HttpLeases(api.url, TOKEN) as leases:

        async def acquire() -> None:
            with pytest.raises(NoCapacity) as failed:
                await leases.acquire("hello")
            refused.append(failed.value)

        await past_the_activation_timeout(api, acquire)
    assert len(refused) == 1


async def test_an_unreachable_activator_is_a_typed_503_error() -> None:
    async with HttpLeases(f"http://127.0.0.1:{free_port()}", TOKEN) as leases:
        with pytest.raises(Unreachable) as refused:
            await leases.acquire("hello")
    assert refused.value.retry_after >= 1


async def test_a_client_that_hangs_up_while_waiting_leaves_no_waiter(api: Served) -> None:
    await nothing_routable(api)  # and the clock stands still: the request waits until it leaves
    async with httpx.AsyncClient(base_url=api.url, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(
                "/v1/leases", json={"app": "hello"}, headers={"Authorization": f"Bearer {TOKEN}"}
            )
    async with httpx.AsyncClient(base_url=api.url) as client:
        with anyio.fail_after(5):
            while True:
                pools = await client.get("/v1/pools", headers={"Authorization": f"Bearer {TOKEN}"})
                if pools.json()[0]["waiters"] == 0:
                    break
                await anyio.sleep(0.05)
