"""One name, one ingress replica (`ingress.nodestreams.peers`): a replica that takes tunnels
waits out a record of its name another relay address holds (a previous run's), and is refused
when a running twin renews it; its own previous run's record (the same relay address) does
not hold it up; and of two that passed that check together, the second to write ends."""

from __future__ import annotations

import time

import anyio
import pytest
from pydantic import BaseModel

from tests.support.store import pass_time
from tests.support.waiting import eventually
from wakeful.domain import keys
from wakeful.domain.models import IngressReplica
from wakeful.ingress.nodestreams.peers import claim_name, hold_record
from wakeful.store import Store, open_store
from wakeful.store.held import CLAIM_MARGIN, HeldRecord, HolderRunning
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio

TTL = 5
"""Renewed every 1.7 s: a loaded machine's stall does not let a running twin's record lapse."""
MINE = IngressReplica(name="r1", relay="10.0.0.1:7001")
TWIN = IngressReplica(name="r1", relay="10.0.0.2:7001")


async def relay_of(store: Store) -> str | None:
    item = await store.get(keys.ingress("r1"), IngressReplica)
    return None if item is None else item.value.relay


async def test_a_running_twin_refuses_the_start_naming_what_to_do(store: Store) -> None:
    twin = HeldRecord(store, keys.ingress("r1"), TWIN, ttl=TTL, what="the twin")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(twin.run)
        await twin.held.wait()
        started = anyio.current_time()
        with (
            anyio.fail_after(TTL + CLAIM_MARGIN + 10),
            pytest.raises(HolderRunning) as refused,
        ):
            await claim_name(store, MINE, TTL)
        assert anyio.current_time() - started >= TTL + CLAIM_MARGIN
        assert str(refused.value) == (
            "ingress replica 'r1' is registered by another ingress that still runs, relaying "
            "at 10.0.0.2:7001: two replicas of one name would take each other's tunnels and "
            "relays; give this one a name of its own (WAKEFUL_TUNNEL_REPLICA) or stop the other"
        )
        assert await relay_of(store) == TWIN.relay  # untouched
        tasks.cancel_scope.cancel()
    await twin.release(within=5)


async def test_its_own_previous_runs_record_does_not_hold_it_up(store: Store) -> None:
    """Killed, the previous run left its record to its TTL; it relayed at this address."""
    lease = await store.grant(TTL)
    await store.put(keys.ingress("r1"), MINE, lease=lease)
    with anyio.fail_after(1):
        await claim_name(store, MINE, TTL)


async def test_another_relays_record_that_is_not_renewed_is_waited_out(
    store: Store, ttl_clock: ManualClock | None, caplog: pytest.LogCaptureFixture
) -> None:
    """A previous run of this name that relayed elsewhere (its port changed since)."""
    lease = await store.grant(TTL)
    await store.put(keys.ingress("r1"), TWIN, lease=lease)
    async with anyio.create_task_group() as tasks:
        claimed = anyio.Event()

        async def claiming() -> None:
            await claim_name(store, MINE, TTL)
            claimed.set()

        tasks.start_soon(claiming)
        await eventually(lambda: "waiting up to 8 s for that record to go" in caplog.text)
        assert not claimed.is_set()
        await pass_time(store, ttl_clock, TTL + 1)
        with anyio.fail_after(TTL + CLAIM_MARGIN):
            await claimed.wait()


async def test_of_two_that_passed_the_check_together_the_second_to_write_ends(
    store: Store,
) -> None:
    """Both found no record; the twin wrote first. This one writes over nothing else."""
    twin = HeldRecord(store, keys.ingress("r1"), TWIN, ttl=TTL, what="the twin")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(twin.run)
        await twin.held.wait()
        with (
            anyio.fail_after(10),
            pytest.raises(HolderRunning, match=r"still runs, relaying at 10\.0\.0\.2:7001"),
        ):
            await hold_record(store, MINE, TTL)
        assert await relay_of(store) == TWIN.relay
        tasks.cancel_scope.cancel()
    await twin.release(within=5)


class Newer(BaseModel):
    """A replica record of a later version, with a field this one does not know."""

    name: str
    relay: str
    instance: str


async def test_a_record_it_cannot_read_is_another_ingresss_and_refuses_the_start(
    store: Store,
) -> None:
    """Counted as another replica's, as `HeldRecord` counts it: waited out, then refused."""
    await store.put(keys.ingress("r1"), Newer(name="r1", relay=MINE.relay, instance="x"))
    started = anyio.current_time()
    with (
        anyio.fail_after(2 + CLAIM_MARGIN + 10),
        pytest.raises(HolderRunning, match=r"relaying at an address \(a record this version"),
    ):
        await claim_name(store, MINE, 2)  # nothing renews it: a short TTL will do
    assert anyio.current_time() - started >= 2 + CLAIM_MARGIN


async def test_a_replica_whose_lapsed_record_another_took_stops_saying_so() -> None:
    """Invariant 19's one exception, for a replica as for a node agent: the store out of reach
    past the record's TTL (its clock moved here), the record goes, and a replica of the same
    name elsewhere writes its own. When this one can write again it finds the other's: it
    stops, and leaves the other's record be."""
    clock = ManualClock(time.time())
    async with open_store("memory://", clock=clock) as store:
        with pytest.RaisesGroup(
            pytest.RaisesExc(HolderRunning, match=r"relays at 10\.0\.0\.2:7001 now: .* lapsed"),
            flatten_subgroups=True,
        ):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(hold_record, store, MINE, TTL)
                with anyio.fail_after(10):
                    while await relay_of(store) is None:  # noqa: ASYNC110 - no event to wait on
                        await anyio.sleep(0.01)
                await pass_time(store, clock, TTL + 1)  # its lease expires, its record goes
                assert await relay_of(store) is None
                await store.put(keys.ingress("r1"), TWIN)
                with anyio.fail_after(10):
                    await anyio.sleep_forever()  # until it ends, at its next renewal
        assert await relay_of(store) == TWIN.relay
