"""An ask's riders at the activator (`Riders`, `LeaseLedger.grow`): a parked ask counts as
the requests riding it, bounded by `max_waiters`, and the bound keeps no phantom: found by a
hostile review of issue 42."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest

from tests.support.activator import make_activator, pool, seed, set_status
from tests.support.waiting import eventually
from wakeful.activator.core import Activator
from wakeful.activator.ledger import Lease
from wakeful.domain import keys
from wakeful.domain.leases import Overloaded, Riders
from wakeful.domain.models import Pool, SandboxStatus
from wakeful.store import Event, Store

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def ask_of_eight(store: Store) -> AsyncIterator[tuple[Activator, Riders]]:
    """An ask of 8 requests parked (nothing routable) on an activator bounded at 10 waiting;
    withdrawn when the block ends."""
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store, max_waiters=10)
    async with activator.running(), anyio.create_task_group() as requests:
        riders = Riders(8)
        requests.start_soon(lambda: activator.acquire("hello", riders=riders))
        await eventually(lambda: activator.snapshot()[0].waiters == 8)
        yield activator, riders
        requests.cancel_scope.cancel()


async def test_riders_leaving_after_the_bound_are_taken_from_those_uncounted(store: Store) -> None:
    """max_waiters 10: an ask of 8, 5 more join (counted to 10, 3 ride uncounted), then 3
    leave: 10 still wait on it, and the activator still counts 10 (it counted 7 once, so a
    new ask of 3 could park past the bound)."""
    async with ask_of_eight(store) as (activator, riders):
        riders.change(5)
        assert activator.snapshot()[0].waiters == 10
        riders.change(-3)  # 10 still ride it
        waiting = activator.snapshot()[0].waiters
    assert riders.count == 10
    assert waiting == 10, f"10 requests wait on the ask; the activator counts {waiting}"


async def test_an_ask_counts_one_at_least_and_remembers_what_it_was_told(store: Store) -> None:
    """An ask stands for one request at least; riders 1 -> 0 -> 1 count one (the floor once
    kept no memory and counted two)."""
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store, max_waiters=10)
    async with activator.running(), anyio.create_task_group() as requests:
        riders = Riders(1)
        requests.start_soon(lambda: activator.acquire("hello", riders=riders))
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        riders.change(-1)
        riders.change(1)
        waiting = activator.snapshot()[0].waiters
        requests.cancel_scope.cancel()
    assert waiting == riders.count == 1, f"1 rider; the activator counts {waiting}"


async def test_shared_asks_count_as_the_requests_they_stand_for(store: Store) -> None:
    """Issue 42: an ingress's misses share asks; seven asks of five requests each size the
    pool as 35 waiting requests would (seed 000), and the waiting count says 35."""
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    start = (await pool(store)).revision
    pool_writes = store.watch(keys.POOLS, start + 1)
    activator = make_activator(store)
    leases: list[Lease] = []

    async def acquire() -> None:
        leases.append(await activator.acquire("hello", riders=Riders(5)))

    async with activator.running(), anyio.create_task_group() as requests:
        for _ in range(7):
            requests.start_soon(acquire)
        await eventually(lambda: activator.snapshot()[0].waiters == 35)
        with anyio.fail_after(10):
            write = await pool_writes.__anext__()
        assert isinstance(write, Event)
        assert write.decode(Pool).desired_instances == 8  # ceil((0 + 35 + 1) / 5)
        await set_status(store, "sb-1", SandboxStatus.RUNNING)
        await eventually(lambda: len(leases) == 7)
    assert activator.snapshot()[0].waiters == 0
    await pool_writes.aclose()  # type: ignore[attr-defined]


async def test_requests_joining_a_parked_ask_grow_the_pool_for_them(store: Store) -> None:
    """An ask out with one rider, then 34 more join it while it waits (an ingress's misses
    one after another): the pool is sized for 35, as 35 asks of one would size it."""
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    start = (await pool(store)).revision
    pool_writes = store.watch(keys.POOLS, start + 1)
    activator = make_activator(store)
    riders = Riders(1)
    async with activator.running(), anyio.create_task_group() as requests:
        requests.start_soon(lambda: activator.acquire("hello", riders=riders))
        await eventually(lambda: activator.snapshot()[0].waiters == 1)  # desired 1 covers it
        riders.change(34)
        assert activator.snapshot()[0].waiters == 35
        with anyio.fail_after(10):
            write = await pool_writes.__anext__()
        assert isinstance(write, Event)
        assert write.decode(Pool).desired_instances == 8  # ceil((0 + 35 + 1) / 5), one write
        requests.cancel_scope.cancel()
    await pool_writes.aclose()  # type: ignore[attr-defined]


async def test_an_ask_past_the_bound_counts_what_fits_and_a_full_queue_refuses(
    store: Store,
) -> None:
    """max_waiters 10, 8 waiting: an ask of 3 parks counting the 2 that fit (the third rides
    uncounted, as riders joining past the bound do); the next ask finds no room, refused."""
    async with ask_of_eight(store) as (activator, riders), anyio.create_task_group() as more:
        second = Riders(3)
        more.start_soon(lambda: activator.acquire("hello", riders=second))
        await eventually(lambda: activator.snapshot()[0].waiters == 10)
        with pytest.raises(Overloaded, match="10 requests waiting already"):
            await activator.acquire("hello", riders=Riders(1))
        assert activator.snapshot()[0].waiters == 10  # nothing parked half-way
        riders.change(5)  # joined while it waits: counted up to the bound, no further
        assert activator.snapshot()[0].waiters == 10
        riders.change(-12)  # left: it stands for one request at least while it waits
        assert activator.snapshot()[0].waiters == 1 + 2
        more.cancel_scope.cancel()


async def test_a_first_burst_larger_than_the_bound_still_wakes_the_app(store: Store) -> None:
    """max_waiters 10 and a cold app's first ask carrying 30 requests: it parks counting 10
    and the pool is sized for them (an ask refused whole for its riders past the bound was
    refused at every retry of such a burst, and the app never woke)."""
    await seed(store, rpi=5, desired=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    start = (await pool(store)).revision
    pool_writes = store.watch(keys.POOLS, start + 1)
    activator = make_activator(store, max_waiters=10)
    async with activator.running(), anyio.create_task_group() as requests:
        requests.start_soon(lambda: activator.acquire("hello", riders=Riders(30)))
        await eventually(lambda: activator.snapshot()[0].waiters == 10)
        with anyio.fail_after(10):
            write = await pool_writes.__anext__()
        assert isinstance(write, Event)
        assert write.decode(Pool).desired_instances == 3  # ceil((0 + 10 + 1) / 5)
        requests.cancel_scope.cancel()
    await pool_writes.aclose()  # type: ignore[attr-defined]
