"""The test harness itself: one event loop for the session, one etcd client on it.

grpc.aio (under the etcd client) fails on a loop that closed while grpc was in use, so every
async test runs on the session's loop and etcd tests share one connection, each under its own
namespace (`session_loop`, `etcd_session` and `store` in tests/conftest.py). What a test leaves
running is cancelled when it ends, as closing a loop of its own used to do
(`cancel_leftover_tasks`).
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from wakeful.store.etcd import EtcdStore

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


@pytest.mark.parametrize("n", [1, 2, 3])
async def test_every_async_test_runs_on_the_session_loop(
    n: int, session_loop: asyncio.AbstractEventLoop
) -> None:
    assert asyncio.get_running_loop() is session_loop
    assert not session_loop.is_closed()


LEFT_RUNNING: list[asyncio.Task[None]] = []


@pytest.mark.parametrize("n", [1, 2])
async def test_a_task_a_test_leaves_running_is_cancelled_when_the_test_ends(n: int) -> None:
    # whichever of the two runs second checks the task the first one left
    assert all(task.cancelled() for task in LEFT_RUNNING)
    LEFT_RUNNING.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))


async def test_an_etcd_view_is_namespaced_and_closing_it_keeps_the_connection(
    etcd_session: EtcdStore, namespace: str
) -> None:
    mine = etcd_session.view(namespace + "a/")
    other = etcd_session.view(namespace + "b/")
    revision = await mine.put("k", Counter(n=1))
    assert await other.get("k", Counter) is None
    await mine.aclose()
    item = await mine.get("k", Counter)
    assert item is not None and (item.value, item.revision) == (Counter(n=1), revision)
    listing = await etcd_session.view(namespace).list("", Counter)
    assert [(i.key, i.revision) for i in listing.items] == [("a/k", revision)]
    with pytest.raises(ValueError, match="namespace"):
        etcd_session.view("no-slashes")
