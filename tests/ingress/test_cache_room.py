"""The lease cache's waiting requests (`LeaseCache.acquire`), on the package's `FakeLeases`
with grants let out one at a time (`hold`): room in a cached lease goes to the requests waiting
in this ingress, one after another until none is left, whoever was told first; and no grant is
ever lost, whether a request took room instead or left."""

from __future__ import annotations

import asyncio

import pytest

from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.cacherules import Use
from wakeful.testing import FakeLeases, FakeSandbox, ManualClock

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


async def request(cache: LeaseCache) -> Use:
    """As the proxy asks: a cached lease with room, or a miss."""
    return cache.take(KEY) or await cache.acquire(KEY)


def cached(cache: LeaseCache) -> int:
    return sum(entry.grant.size for entry in cache.snapshot())


async def test_misses_one_after_another_ride_the_ask_that_is_out_and_it_counts_them() -> None:
    """Issue 42: misses that come while an ask is out ride it (up to what a lease carries),
    and the activator is told of each (`Riders`): its demand is a slot per waiting request."""
    fake, gate = leases(capacity=25, size=5)
    cache = LeaseCache(fake, idle_ttl=60)
    waiting = []
    for _ in range(5):  # each in a turn of the loop of its own
        waiting.append(asyncio.create_task(cache.acquire(KEY)))
        await settle()
    assert fake.asks == [1]  # one ask, sent with the first
    assert fake.riders[0].count == 5  # and the four that joined it, counted upstream
    waiting[-1].cancel()  # one leaves: counted out
    await settle()
    assert fake.riders[0].count == 4
    gate.release()  # one grant (of 5) carries them all
    await settle()
    assert all(task.done() for task in waiting)
    assert [entry.uses for entry in cache.snapshot()] == [4]
    assert sum(fake.leased.values()) == cached(cache) == 5
    for task in waiting[:-1]:
        cache.put(task.result())


@pytest.mark.parametrize("cancels_cleanly", [True, False], ids=["channel", "http"])
async def test_an_ask_overtaken_by_room_is_withdrawn_or_its_grant_kept(
    cancels_cleanly: bool,
) -> None:
    """Leases of 1 (one rider an ask): four asks out, then a request ends and its room goes
    to one of them. Its ask is withdrawn where the adapter cancels cleanly (no phantom waiter
    at the activator, which would scale up for it), kept running over plain HTTP (its grant
    cached): either way nothing is lost."""
    fake, gate = leases(capacity=25, size=1, cancels_cleanly=cancels_cleanly)
    cache = LeaseCache(fake, idle_ttl=60)
    first = asyncio.create_task(request(cache))
    await settle()
    gate.release()
    await settle()
    waiting = [asyncio.create_task(request(cache)) for _ in range(4)]
    await settle()
    assert fake.asks == [1] * 5  # the size is known: 1, so one rider an ask
    cache.put(first.result())  # room: one of the four takes it
    await settle()
    assert sum(task.done() for task in waiting) == 1
    for _ in range(4):  # the three asks still needed, and the overtaken one if still out
        gate.release()
    await settle()
    assert all(task.done() for task in waiting)
    expected = 4 if cancels_cleanly else 5  # withdrawn, or kept with its grant cached
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


async def test_misses_of_one_turn_share_one_ask_that_says_how_many_they_are() -> None:
    """Issue 42: a burst of misses takes the leases it needs, not one lease each; each ask
    tells the activator how many requests wait on it (its demand stays exact, seed 000)."""
    fake, gate = leases(capacity=100, size=5)
    cache = LeaseCache(fake, idle_ttl=60)
    burst = [asyncio.create_task(cache.acquire(KEY)) for _ in range(3)]
    await settle()
    assert fake.asks == [3]  # the size is not known yet: all of them on one ask
    gate.release()
    await settle()
    assert all(task.done() for task in burst)
    assert [entry.uses for entry in cache.snapshot()] == [3]
    # The size is known now: 12 more misses in one turn take 2 left in the lease, then ride
    # asks of at most 5; each ask's grant carries all its riders.
    more = [asyncio.create_task(request(cache)) for _ in range(12)]
    await settle()
    assert sum(task.done() for task in more) == 2  # the room left, taken at once
    assert fake.asks == [3, 5, 5]
    for _ in range(2):
        gate.release()
    await settle()
    assert all(task.done() for task in more)
    assert sorted(entry.uses for entry in cache.snapshot()) == [5, 5, 5]
    assert sum(fake.leased.values()) == cached(cache) == 15  # three leases, nothing else
    for task in [*burst, *more]:
        cache.put(task.result())


async def test_riders_an_overflow_lease_cannot_carry_ask_again_each_for_itself() -> None:
    """A full pool grants overflow leases (one request each): one rider takes it, the others
    ask again, one ask each from then on (not one after another on a shared ask)."""
    fake, gate = leases(capacity=1, size=1)
    cache = LeaseCache(fake, idle_ttl=60)
    first = asyncio.create_task(cache.acquire(KEY))
    await settle()
    gate.release()
    await settle()
    assert first.done()  # the sandbox's one slot, cached
    riders = [asyncio.create_task(request(cache)) for _ in range(3)]
    await settle()
    assert fake.asks == [1, 1, 1, 1]  # the size learnt was 1: one ask each
    for _ in range(3):
        gate.release()
    await settle()
    uses = [task.result() for task in riders]
    assert all(use.lease.grant.overflow and not use.lease.cached for use in uses)
    assert len({use.lease.grant.lease_id for use in uses}) == 3
    for use in [first.result(), *uses]:
        released = cache.put(use)
        if released is not None:
            await cache.release(released)
    assert sum(fake.leased.values()) == cached(cache) == 1  # the overflow leases went back


async def test_an_overflow_grant_for_several_riders_goes_to_one_the_rest_ask_again() -> None:
    fake, gate = leases(capacity=2, size=2)
    cache = LeaseCache(fake, idle_ttl=60)
    holder = asyncio.create_task(cache.acquire(KEY))
    await settle()
    gate.release()
    await settle()
    both = [holder.result(), await request(cache)]  # the lease of 2, full
    riders = [asyncio.create_task(request(cache)) for _ in range(3)]
    await settle()
    assert fake.asks == [1, 2, 1]  # the lease size is 2: two ride one ask, one another
    gate.release()  # an overflow lease: one of the first ask's two riders takes it
    await settle()
    assert sum(task.done() for task in riders) == 1
    assert fake.asks == [1, 2, 1, 1]  # the other rider asks alone now (size learnt: 1)
    for _ in range(3):
        gate.release()
    await settle()
    assert all(task.done() for task in riders)
    for use in [*both, *(task.result() for task in riders)]:
        released = cache.put(use)
        if released is not None:
            await cache.release(released)
    assert sum(fake.leased.values()) == cached(cache) == 2


async def test_a_lease_the_load_no_longer_needs_goes_idle_and_back() -> None:
    """A burst took two leases of 5 on one sandbox; then the load is 4 requests at a time.
    They all go to the busier lease (`pick` packs a sandbox's leases), so the other goes idle
    and is handed back after `idle_ttl`, for another ingress to have, rather than being kept
    alive by a share of every request."""
    fake, gate = leases(capacity=25, size=5)
    clock = ManualClock()
    cache = LeaseCache(fake, idle_ttl=30, clock=clock)
    burst = [asyncio.create_task(request(cache)) for _ in range(10)]
    await settle()
    gate.release()
    await settle()
    gate.release()  # the five the first lease could not carry, on a second ask
    await settle()
    assert len(cache.snapshot()) == 2
    for task in burst:
        cache.put(task.result())
    for _ in range(40):  # 4 at a time, for 40 s
        uses = [cache.take(KEY) for _ in range(4)]
        assert all(use is not None for use in uses)
        assert len({use.lease.grant.lease_id for use in uses if use is not None}) == 1
        for use in uses:
            assert use is not None
            cache.put(use)
        clock.advance(1)
        await cache.maintain()
    [kept] = cache.snapshot()
    assert sum(fake.leased.values()) == kept.grant.size == 5  # the other went back
