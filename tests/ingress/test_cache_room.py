"""The lease cache's waiting requests (`LeaseCache.acquire`), on the package's `FakeLeases`
with grants let out one at a time (`hold`): room in a cached lease goes to the requests waiting
in this ingress, one after another until none is left, whoever was told first; and no grant is
ever lost, whether a request took room instead or left."""

from __future__ import annotations

import asyncio

import pytest

from wakeful.ingress.cache import LeaseCache, Use
from wakeful.testing import FakeLeases, FakeSandbox

pytestmark = pytest.mark.anyio
KEY = ("app", None)


def leases(
    capacity: int, size: int, cancels_cleanly: bool = True
) -> tuple[FakeLeases, asyncio.Semaphore]:
    """A sandbox of `capacity`, leases of `size`, and the gate each grant waits at."""
    gate = asyncio.Semaphore(0)
    fake = FakeLeases(
        {"app": [FakeSandbox("sb", "http://127.0.0.1:1", capacity)]},
        size=size,
        hold=gate.acquire,
        cancels_cleanly=cancels_cleanly,
    )
    return fake, gate


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def cached(cache: LeaseCache) -> int:
    return sum(entry.grant.size for entry in cache.snapshot())


@pytest.mark.parametrize("cancels_cleanly", [True, False], ids=["channel", "http"])
async def test_one_grant_of_five_serves_five_waiting_requests(cancels_cleanly: bool) -> None:
    """The asks the room overtook are withdrawn where the adapter cancels cleanly (no phantom
    waiters at the activator, which would scale up for them), kept running over plain HTTP
    (their grants cached): either way nothing is lost."""
    fake, gate = leases(capacity=25, size=5, cancels_cleanly=cancels_cleanly)
    cache = LeaseCache(fake, idle_ttl=60)
    waiting = [asyncio.create_task(cache.acquire(KEY)) for _ in range(5)]
    await settle()
    gate.release()  # one grant (of 5) comes out
    await settle()
    assert all(task.done() for task in waiting), "room left in the lease, requests still wait"
    assert [entry.uses for entry in cache.snapshot()] == [5]
    for _ in range(4):  # the four asks overtaken by the room, if still out, are granted now
        gate.release()
    await settle()
    expected = 5 if cancels_cleanly else 25  # withdrawn, or kept with their grants cached
    assert sum(fake.leased.values()) == cached(cache) == expected  # nothing lost
    for task in waiting:
        cache.put(task.result())


async def test_room_announced_to_a_request_that_does_not_need_it_goes_to_the_next() -> None:
    """Found by a reviewer: A is told of freed room in the same step its own grant arrives;
    B, waiting too, must still hear of the room."""
    fake, gate = leases(capacity=10, size=1)
    cache = LeaseCache(fake, idle_ttl=60)
    first = asyncio.create_task(cache.acquire(KEY))
    gate.release()
    running: Use = await first
    a = asyncio.create_task(cache.acquire(KEY))
    b = asyncio.create_task(cache.acquire(KEY))
    await settle()
    gate.release()  # A's ask is granted...
    cache.put(running)  # ...and in the same step a request ends, freeing room: A is told
    await settle()
    assert a.done() and b.done(), "B waits while a cached lease has room"
    for task in (a, b):
        cache.put(task.result())
    gate.release()  # B's ask, overtaken by the room, is still out: its grant is kept
    await settle()
    assert sum(fake.leased.values()) == cached(cache)


async def test_a_request_that_leaves_loses_no_grant() -> None:
    fake, gate = leases(capacity=10, size=1)
    cache = LeaseCache(fake, idle_ttl=60)
    leaving = asyncio.create_task(cache.acquire(KEY))
    await settle()
    gate.release()
    leaving.cancel()  # in the same step its grant came out
    await settle()
    if not leaving.cancelled():  # the grant won the race: the request got its use
        cache.put(leaving.result())
    assert sum(fake.leased.values()) == cached(cache) == 1  # the grant is in the cache


async def test_a_grant_on_another_version_than_asked_is_cached_under_its_own() -> None:
    """Issue 39: asked for v2 (the ingress's split), granted on v1 (the activator's view no
    longer serves v2): the lease serves this request, and is cached as v1's, so the next
    request for v2 asks again instead of following it to v1 for as long as it is renewed."""
    fake = FakeLeases({"web": [FakeSandbox("sb-1", "http://sb-1", capacity=10)]}, on_version="v1")
    cache = LeaseCache(fake, idle_ttl=60)
    use = await cache.acquire(("web", "v2"))
    assert use.lease.grant.sandbox_id == "sb-1"
    assert cache.put(use) is None  # kept, under v1
    assert cache.take(("web", "v2"), ()) is None
    assert cache.take(("web", "v1"), ()) is not None
