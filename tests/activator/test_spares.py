"""A pool short of normal capacity asks its holders for the leases they do not use (issue 42:
normal leases spread over the ingresses that ask): `LeaseLedger.short_of`,
`Activator.renew_grant`, `wakeful.domain.leases.short`."""

from __future__ import annotations

import anyio
import pytest

from tests.support.activator import make_activator, seed, set_status
from tests.support.waiting import eventually
from wakeful.activator.ledger import Lease
from wakeful.domain.leases import SHORT_SECONDS
from wakeful.domain.models import SandboxStatus
from wakeful.store import Store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_an_overflow_admission_asks_for_spare_leases_for_a_while(store: Store) -> None:
    # rpi 5: leases of 1, five fill the sandbox; the sixth request is admitted on overflow.
    await seed(store, rpi=5, max_instances=1, sandboxes={"sb-1": SandboxStatus.RUNNING})
    clock = ManualClock()
    activator = make_activator(store, clock=clock)
    async with activator.running():
        held = [await activator.acquire("hello") for _ in range(5)]
        assert not any(lease.overflow for lease in held)
        assert not activator.renew_grant(held[0].lease_id).spare_wanted  # room was there
        overflow = await activator.acquire("hello")
        assert overflow.overflow
        activator.release(overflow.lease_id)
        assert activator.renew_grant(held[0].lease_id).spare_wanted
        clock.advance(SHORT_SECONDS - 0.5)
        assert activator.renew_grant(held[1].lease_id, used=True).spare_wanted
        clock.advance(0.5)  # no request short since: the holders keep what they hold
        assert not activator.renew_grant(held[1].lease_id).spare_wanted


async def test_a_wait_at_the_hard_limit_asks_for_spare_leases_too(store: Store) -> None:
    # hard limit 5 = rpi: no overflow lease is possible; the sixth request waits.
    await seed(
        store, rpi=5, hard_limit=5, max_instances=1, sandboxes={"sb-1": SandboxStatus.RUNNING}
    )
    activator = make_activator(store)
    async with activator.running(), anyio.create_task_group() as tasks:
        held = [await activator.acquire("hello") for _ in range(5)]
        assert not activator.renew_grant(held[0].lease_id).spare_wanted
        tasks.start_soon(activator.acquire, "hello")
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        assert activator.renew_grant(held[0].lease_id).spare_wanted
        tasks.cancel_scope.cancel()


async def test_a_request_still_waiting_at_the_hard_limit_keeps_asking(store: Store) -> None:
    """A parked request runs admission again only when its pool changes: with nothing
    released, `short_at` is its park time alone. The holders must still be asked while it
    waits (up to its activation timeout), not only for `SHORT_SECONDS` after it parked: a
    holder whose leases are quiet renews them every lease TTL / 3 (20 s by default), and
    would hear nothing before its idle TTL handed them back anyway."""
    await seed(
        store, rpi=5, hard_limit=5, max_instances=1, sandboxes={"sb-1": SandboxStatus.RUNNING}
    )
    clock = ManualClock()
    activator = make_activator(store, clock=clock)
    async with activator.running(), anyio.create_task_group() as tasks:
        held = [await activator.acquire("hello") for _ in range(5)]
        tasks.start_soon(activator.acquire, "hello")
        await eventually(lambda: activator.snapshot()[0].waiters == 1)
        clock.advance(SHORT_SECONDS + 10)  # still waiting: its timeout is 120 s
        assert activator.snapshot()[0].waiters == 1
        assert activator.renew_grant(held[0].lease_id).spare_wanted
        activator.release(held[1].lease_id)  # a holder hands one back: the wait is over
        await eventually(lambda: activator.snapshot()[0].waiters == 0)
        clock.advance(SHORT_SECONDS)
        assert not activator.renew_grant(held[0].lease_id).spare_wanted
        tasks.cancel_scope.cancel()


async def test_the_holders_are_told_as_a_pool_turns_short_once_a_spell(store: Store) -> None:
    """`Activator.spare_asks`: told (app, version) as the pool turns short, by an overflow
    or by a wait at the hard limit, and not again while it stays short; told again once it
    was not short for a while. A listener stopped hears nothing more."""
    await seed(store, rpi=5, max_instances=1, sandboxes={"sb-1": SandboxStatus.RUNNING})
    clock = ManualClock()
    activator = make_activator(store, clock=clock)
    heard: list[tuple[str, str]] = []
    stop = activator.spare_asks.heed(lambda app, version: heard.append((app, version)))
    async with activator.running():
        held = [await activator.acquire("hello") for _ in range(5)]
        assert heard == []  # room was there
        overflows = [await activator.acquire("hello") for _ in range(3)]
        assert all(lease.overflow for lease in overflows)
        assert heard == [("hello", "v1")]  # once, though three overflowed
        clock.advance(SHORT_SECONDS + 1)
        overflows.append(await activator.acquire("hello"))
        assert heard == [("hello", "v1")] * 2  # a new spell
        stop()
        clock.advance(SHORT_SECONDS + 1)
        overflows.append(await activator.acquire("hello"))
        assert len(heard) == 2
        for lease in held + overflows:
            activator.release(lease.lease_id)


async def test_a_spell_that_begins_while_requests_wait_for_a_start_is_told(
    store: Store,
) -> None:
    """Seven requests wait for a booting sandbox (nothing routable: nobody is told); it comes
    up, five get normal leases and two overflow ones, the first while the last still waits.
    That overflow begins the spell, and the holders hear it, though requests were waiting
    (found by a review: judged by the waiting too, it was never told, and the overflows
    after it kept the spell going)."""
    await seed(store, rpi=5, max_instances=1, sandboxes={"sb-1": SandboxStatus.BOOTING})
    activator = make_activator(store)
    heard: list[tuple[str, str]] = []
    activator.spare_asks.heed(lambda app, version: heard.append((app, version)))
    leases: list[Lease] = []

    async def one() -> None:
        leases.append(await activator.acquire("hello"))

    async with activator.running(), anyio.create_task_group() as tasks:
        for _ in range(7):
            tasks.start_soon(one)
        await eventually(lambda: activator.snapshot()[0].waiters == 7)
        assert heard == []
        await set_status(store, "sb-1", SandboxStatus.RUNNING)
    assert sum(lease.overflow for lease in leases) == 2
    assert heard == [("hello", "v1")]
    for lease in leases:
        activator.release(lease.lease_id)
