"""Shared asks under every interleaving (`LeaseCache`, issue 42): requests cancelled at any
moment, grants that come as the cache closes, refusals nobody reads, random schedules over the
package's `FakeLeases` and riders counted out on the real activator. Every use is handed back
once, no lease is used after its release or released twice, and what the activator counts is
what waits. Found or written by a hostile review."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections.abc import Callable

import pytest

from tests.support.ingress import stack
from tests.support.waiting import eventually
from wakeful.activator.client import InProcessLeases
from wakeful.domain.leases import LeaseGrant, NoCapacity, Riders
from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.cacherules import Use
from wakeful.testing import FakeLeases, FakeSandbox

pytestmark = pytest.mark.anyio
KEY = ("app", None)


async def spin(turns: int = 20) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


async def until(check: Callable[[], bool]) -> None:
    """Turns of the loop until `check` holds (a step between two others, no timer)."""
    for _ in range(10_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never came")


class Counted(FakeLeases):
    """`FakeLeases` that records each release, and can refuse a share of its grants."""

    def __init__(
        self, *args: object, refuse: float = 0.0, rnd: random.Random | None = None, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.released: list[str] = []
        self.alive: set[str] = set()
        self._refuse = refuse
        self._rnd = rnd or random.Random(0)

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> LeaseGrant:
        grant = await super().acquire(app, version, riders=riders)
        if self._refuse and self._rnd.random() < self._refuse:
            await super().release(grant.lease_id)
            raise NoCapacity("refused", retry_after=1)
        self.alive.add(grant.lease_id)
        return grant

    async def release(self, lease_id: str) -> None:
        self.released.append(lease_id)
        self.alive.discard(lease_id)
        await super().release(lease_id)


def gated(capacity: int = 10, size: int = 5) -> tuple[Counted, asyncio.Semaphore]:
    gate = asyncio.Semaphore(0)
    sandboxes = {"app": [FakeSandbox("sb", "http://127.0.0.1:1", capacity)]}
    return Counted(sandboxes, size=size, hold=gate.acquire), gate


async def test_a_grant_the_closing_cache_released_is_not_used_by_its_rider() -> None:
    """The grant settled into the cache; before its rider looked, the cache closed (at
    shutdown), releasing it. The rider asks again instead of taking a use of it."""
    fake, gate = gated()
    cache = LeaseCache(fake, idle_ttl=60)
    rider = asyncio.create_task(cache.acquire(KEY))
    await spin()
    gate.release()
    await until(lambda: bool(cache.snapshot()))  # settled; the rider not woken yet
    assert not rider.done()
    await cache.close()
    assert fake.released == ["fake-1"]
    gate.release()  # its new ask
    use = await rider
    assert use.lease.grant.lease_id in fake.alive
    released = cache.put(use)
    assert released is not None  # the cache is closed: it goes straight back
    await cache.release(released)
    assert fake.released == ["fake-1", "fake-2"]  # each once


async def test_a_grant_the_closing_cache_released_is_not_released_again_by_its_rider() -> None:
    fake, gate = gated()
    cache = LeaseCache(fake, idle_ttl=60)
    rider = asyncio.create_task(cache.acquire(KEY))
    await spin()
    gate.release()
    await until(lambda: bool(cache.snapshot()))
    await cache.close()
    rider.cancel()
    await spin()
    assert rider.cancelled()
    assert fake.released == ["fake-1"]


async def test_a_refusal_whose_rider_left_as_it_came_is_not_logged_as_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Semaphore(0)
    cache = LeaseCache(FakeLeases({}, hold=gate.acquire), idle_ttl=60)  # every app unknown
    rider = asyncio.create_task(cache.acquire(KEY))
    await spin()
    gate.release()
    await until(lambda: not cache._open)  # the refusal settled; the rider not woken yet
    rider.cancel()
    await spin()
    assert rider.cancelled()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await spin()
    assert "never retrieved" not in caplog.text, caplog.text


async def schedule(seed: int, *, close: bool) -> None:
    """A random schedule: bursts of requests, grants let out, requests cancelled, uses put
    back, sandboxes dropped, the cache closed early or late; then everything drained."""
    rnd = random.Random(seed)
    gate = asyncio.Semaphore(0)
    sandboxes = rnd.choice([1, 2])
    fake = Counted(
        {
            "app": [
                FakeSandbox(f"sb{i}", f"http://sb{i}", rnd.choice([1, 2, 5, 40]))
                for i in range(sandboxes)
            ]
        },
        size=rnd.choice([1, 2, 3, 5]),
        hold=gate.acquire,
        cancels_cleanly=rnd.random() < 0.5,
        refuse=rnd.choice([0.0, 0.0, 0.2]),
        rnd=rnd,
    )
    cache = LeaseCache(fake, idle_ttl=60)
    tasks: list[asyncio.Task[Use]] = []
    releasing: list[asyncio.Future[None]] = []
    closing: asyncio.Future[None] | None = None

    async def request() -> Use:
        return cache.take(KEY) or await cache.acquire(KEY, avoid=rnd.choice([(), ("sb0",)]))

    def put(use: Use) -> None:
        assert use.lease.grant.lease_id in fake.alive, f"a use of a released lease {use}"
        grant = cache.put(use)
        if grant is not None:
            releasing.append(asyncio.ensure_future(cache.release(grant)))

    def put_done() -> None:
        for task in [t for t in tasks if t.done()]:
            tasks.remove(task)
            if not task.cancelled() and task.exception() is None:
                put(task.result())

    for _ in range(rnd.randint(20, 120)):
        action = rnd.random()
        if action < 0.3:
            tasks += [asyncio.create_task(request()) for _ in range(rnd.randint(1, 6))]
        elif action < 0.5:
            for _ in range(rnd.randint(1, 3)):
                gate.release()
        elif action < 0.65:
            waiting = [t for t in tasks if not t.done()]
            if waiting:
                rnd.choice(waiting).cancel()
        elif action < 0.8:
            put_done()
        elif action < 0.81 and close and closing is None:
            closing = asyncio.ensure_future(cache.close())
        elif action < 0.83:
            for grant in cache.drop_sandbox(f"sb{rnd.randrange(sandboxes)}"):
                releasing.append(asyncio.ensure_future(cache.release(grant)))
        await spin(rnd.randint(0, 3))
    if close and closing is None:
        closing = asyncio.ensure_future(cache.close())
    for _ in range(2000):  # every ask let out, every use handed back
        gate.release()
        await spin(2)
        put_done()
        if not tasks:
            break
    assert not tasks, "requests still waiting"
    for _ in range(50):
        gate.release()
    await spin(50)
    if closing is not None:
        await closing
    await asyncio.gather(*releasing)
    await cache._releasing.wait()
    await spin()
    assert not cache.held()
    assert all(entry.uses == 0 for entry in cache.snapshot())
    cached = sum(entry.grant.size for entry in cache.snapshot())
    assert sum(fake.leased.values()) == (0 if close else cached), (fake.leased, cached)
    twice = {x for x in fake.released if fake.released.count(x) > 1}
    assert not twice, f"released twice: {twice}"


@pytest.mark.parametrize("seed", range(120))
async def test_random_schedules_lose_no_lease_and_use_none_released(seed: int) -> None:
    await schedule(seed, close=False)


@pytest.mark.parametrize("seed", range(120))
async def test_random_schedules_with_a_close_leave_nothing_leased(seed: int) -> None:
    await schedule(seed, close=True)


@pytest.mark.parametrize("seed", range(6))
async def test_riders_leaving_a_parked_ask_are_counted_out_on_the_real_activator(
    seed: int,
) -> None:
    """Twelve requests wait for a booting sandbox on shared asks; some leave at random, more
    come: the activator counts exactly those waiting, and once the sandbox runs every lease
    is accounted for."""
    rnd = random.Random(seed)
    async with stack({"sb-1": None}, rpi=rnd.choice([1, 5, 20, 100])) as s:
        cache = LeaseCache(InProcessLeases(s.activator), idle_ttl=60)
        key = ("hello", "v1")
        riders = [asyncio.create_task(cache.acquire(key)) for _ in range(12)]
        await eventually(lambda: s.activator.snapshot()[0].waiters == 12)
        for _ in range(rnd.randint(0, 12)):
            rnd.choice([t for t in riders if not t.done()]).cancel()
            await spin(2)
            waiting = sum(not t.done() for t in riders)
            assert s.activator.snapshot()[0].waiters == waiting
        more = [asyncio.create_task(cache.acquire(key)) for _ in range(rnd.randint(0, 5))]
        await spin()
        waiting_now = [t for t in riders + more if not t.done()]
        await eventually(lambda: s.activator.snapshot()[0].waiters == len(waiting_now))
        await s.put_sandbox("sb-1", 1)  # running (never connected to)
        if waiting_now:
            await asyncio.wait(waiting_now, timeout=10)
        for task in waiting_now:
            released = cache.put(task.result())
            if released is not None:
                await cache.release(released)
        await cache._releasing.wait()
        assert s.leased() == sum(entry.grant.size for entry in cache.snapshot())
        await cache.close()
        await eventually(lambda: s.leased() == 0)
        assert s.activator.snapshot()[0].waiters == 0
