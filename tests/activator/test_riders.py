"""An ask's riders at the activator (`Riders`, `LeaseLedger.grow`): a parked ask counts as
the requests riding it, bounded by `max_waiters`, and the bound keeps no phantom: found by a
hostile review of issue 42."""

from __future__ import annotations

import anyio
import pytest

from tests.support.activator import make_activator, seed
from tests.support.waiting import eventually
from wakeful.domain.leases import Riders
from wakeful.domain.models import SandboxStatus
from wakeful.store import Store

pytestmark = pytest.mark.anyio


async def test_riders_leaving_after_the_bound_are_taken_from_those_uncounted(store: Store) -> None:
    """max_waiters 10: an ask of 8, 5 more join (counted to 10, 3 ride uncounted), then 3
    leave: 10 still wait on it, and the activator still counts 10 (it counted 7 once, so a
    new ask of 3 could park past the bound)."""
    await seed(store, rpi=5, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store, max_waiters=10)
    async with activator.running(), anyio.create_task_group() as requests:
        riders = Riders(8)
        requests.start_soon(lambda: activator.acquire("hello", riders=riders))
        await eventually(lambda: activator.snapshot()[0].waiters == 8)
        riders.change(5)
        assert activator.snapshot()[0].waiters == 10
        riders.change(-3)  # 10 still ride it
        waiting = activator.snapshot()[0].waiters
        requests.cancel_scope.cancel()
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
