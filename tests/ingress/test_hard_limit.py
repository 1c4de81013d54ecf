"""`concurrency.hard_limit` through the ingress: past it on every sandbox a request waits (it is
never forwarded to a sandbox that cannot take it), and the room a finished request frees in
the ingress's own lease cache goes to the request waiting in that ingress at once, not after
the cached lease idles back to the activator."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from tests.support.ingress import held, stack
from wakeful.domain.models import AppSpec, Concurrency

pytestmark = pytest.mark.anyio


async def test_past_the_hard_limit_a_request_waits_for_room_and_then_takes_it(
    hello: Callable[[], int],
) -> None:
    spec = AppSpec(
        command=["serve"],
        concurrency=Concurrency(requests_per_instance=1, max_instances=1, hard_limit=1),
        activation_timeout=120,
    )
    async with stack(
        {"s1": hello()}, rpi=1, max_instances=1, pool_update={"spec": spec}, lease_idle_ttl=600
    ) as s:
        release = anyio.Event()
        statuses: list[int] = []

        async def first() -> None:
            statuses.append(await held(s.client, release))

        async def second() -> None:
            statuses.append((await s.client.get("/")).status_code)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(first)
                while s.sample("requests_in_flight", app="hello") < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                tasks.start_soon(second)
                while s.sample("requests_queued", app="hello") < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                # The second waits; the sandbox never carries two requests at once.
                assert s.sample("requests_in_flight", app="hello") == 1
                assert statuses == []
                release.set()  # the first ends: its room goes to the second here and now
    assert statuses == [200, 200]
    assert s.activator.leased_on("s1") <= 1
