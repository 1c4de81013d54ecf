"""`Marks` (`wakeful.aio.marks`): how far each named holder says it has come, and a wait until
all have reached a mark; what a deploy waits on for the ingresses' routes. Each way a wait
could end before the ingresses route the app has its case: a lost channel, an ingress's
next channel beside its old one, a control plane that has just taken over."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest

from tests.support.waiting import eventually
from wakeful.aio.marks import Marks
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def waiting(marks: Marks, mark: int) -> AsyncIterator[list[dict[str, int]]]:
    """A wait for `mark` under way (parked) while the block runs; what it returned is in the
    list the block gets, once the block is over and the wait ended."""
    done: list[dict[str, int]] = []

    async def wait() -> None:
        done.append(await marks.wait(mark, within=60))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait)
        await eventually(lambda: marks.waiting == 1)
        yield done


async def test_a_wait_ends_when_the_last_name_behind_reaches_the_mark() -> None:
    marks = Marks(settle=0)
    first, second = object(), object()
    marks.saw(first, "edge-1", 10)
    marks.saw(second, "edge-2", 7)
    assert marks.behind(10) == {"edge-2": 7} and len(marks) == 2
    assert await marks.wait(7, within=0) == {}  # both there already: no wait at all
    async with waiting(marks, 10) as done:
        marks.saw(second, "edge-2", 9)  # moved, still behind: the wait goes on
        marks.saw(second, "edge-2", 8)  # lower: changes nothing
        await anyio.sleep(0.01)
        assert done == [] and marks.behind(10) == {"edge-2": 9}
        marks.saw(second, "edge-2", 12)
    assert done == [{}] and marks.waiting == 0


async def test_a_lost_holder_lingers_and_its_name_s_next_holder_takes_over() -> None:
    """A channel lost while its ingress is behind does not end the wait: its mark counts
    for `linger` seconds, until the ingress's next channel reports."""
    clock = ManualClock()
    marks = Marks(linger=5, settle=0, clock=clock)
    old, new = object(), object()
    marks.saw(old, "edge-1", 3)
    marks.gone(old)
    assert marks.behind(10) == {"edge-1": 3} and len(marks) == 1
    marks.saw(new, "edge-1", 4)  # its next channel: the linger is over
    assert marks.behind(10) == {"edge-1": 4} and len(marks) == 1
    marks.gone(new)
    clock.advance(4.9)
    assert marks.behind(10) == {"edge-1": 4}
    clock.advance(0.2)  # never came back: it stops counting
    assert marks.behind(10) == {} and len(marks) == 0


async def test_a_lingering_name_holds_a_wait_until_it_expires_in_real_time() -> None:
    marks = Marks(linger=0.2, settle=0)
    holder = object()
    marks.saw(holder, "edge-1", 3)
    marks.gone(holder)
    with anyio.fail_after(10):
        assert await marks.wait(10, within=0.05) == {"edge-1": 3}
        assert await marks.wait(10, within=30) == {}  # over when the linger is


async def test_a_holder_that_stops_is_forgotten_at_once() -> None:
    marks = Marks(settle=0)
    draining, other = object(), object()
    marks.saw(draining, "edge-1", 3)
    marks.saw(other, "edge-2", 10)
    async with waiting(marks, 10) as done:
        marks.gone(draining, linger=False)
    assert done == [{}] and len(marks) == 1
    marks.gone(draining)  # again: harmless


async def test_a_name_s_new_holder_replaces_its_old_one_not_yet_closed() -> None:
    """An ingress's new channel reports while the activator has not noticed its old one
    close (a half-open connection): the name is the new holder's alone."""
    marks = Marks(settle=0)
    old, new = object(), object()
    marks.saw(old, "edge-1", 5)
    marks.saw(new, "edge-1", 12)
    assert marks.behind(10) == {} and len(marks) == 1
    marks.gone(old)  # its close, noticed at last: nothing lingers
    assert marks.behind(10) == {} and len(marks) == 1


async def test_a_new_control_plane_waits_for_its_ingresses_to_find_it() -> None:
    """Just after a takeover no ingress has reported yet: a wait lasts the settling time
    before it judges, so an ingress that reports meanwhile is waited for."""
    marks = Marks(settle=0.3)
    with anyio.fail_after(10):
        async with waiting(marks, 10) as done:
            marks.saw(object(), "edge-1", 4)  # found the new leader, behind
            await anyio.sleep(0.4)
            assert done == []  # settled, and edge-1 is behind
            marks.saw(object(), "edge-1", 10)
    assert done == [{}]


async def test_a_control_plane_that_took_nothing_over_judges_at_once() -> None:
    marks = Marks(settle=30)
    marks.settle(0)
    marks.saw(object(), "edge-1", 4)
    with anyio.fail_after(10):
        assert await marks.wait(10, within=0.05) == {"edge-1": 4}
        assert await marks.wait(4, within=30) == {}


async def test_one_token_s_holder_cannot_stand_for_another_s_ingress() -> None:
    """The names are the ingresses' own, within the token their channel was opened with: a
    channel reporting another token's ingress name beside it is another ingress."""
    marks = Marks(settle=0)
    real, claimed = object(), object()
    marks.saw(real, "edge-1", 10, scope="token:edge")
    marks.saw(claimed, "edge-1", 0, scope="token:other")
    assert marks.behind(10) == {"edge-1": 0} and len(marks) == 2
    marks.gone(claimed, linger=False)
    assert marks.behind(10) == {} and len(marks) == 1  # the real one still counts


async def test_a_holder_renamed_starts_from_its_new_name_s_mark() -> None:
    marks = Marks(settle=0)
    holder = object()
    marks.saw(holder, "a", 10**12)
    marks.saw(holder, "b", 0)
    assert marks.behind(1) == {"b": 0} and len(marks) == 1


async def test_a_lost_holder_s_linger_ends_even_when_nobody_asks() -> None:
    """Channels that come and go with names of their own leave nothing behind for long."""
    clock = ManualClock()
    marks = Marks(linger=5, settle=0, clock=clock)
    for n in range(100):
        holder = object()
        marks.saw(holder, f"edge-{n}", 1)
        marks.gone(holder)
        clock.advance(1)
    assert len(marks._left) <= 6


async def test_two_instances_of_one_name_both_count_from_their_first_reports() -> None:
    """Two ingresses that took one name (two machines of one short hostname), each a process
    with its own random instance id: both count at once, shown apart while both are there,
    and `saw` says so once, when the second appears; one's next channel (same instance) is
    no third."""
    marks = Marks(settle=0)
    first, second, second_again = object(), object(), object()
    assert marks.saw(first, "edge-8080", 5, instance="aa") is None
    assert marks.saw(second, "edge-8080", 5, instance="bb") == "edge-8080 (bb)"
    assert len(marks) == 2
    async with waiting(marks, 9) as done:
        assert marks.saw(first, "edge-8080", 9, instance="aa") is None
        await anyio.sleep(0.01)
        assert done == [] and marks.behind(9) == {"edge-8080 (bb)": 5}
        marks.gone(second)  # its channel lost: it lingers, still behind
        await anyio.sleep(0.01)
        assert done == []
        assert marks.saw(second_again, "edge-8080", 9, instance="bb") is None  # it is back
    assert done == [{}] and len(marks) == 2
    marks.gone(second_again, linger=False)
    assert marks.behind(10) == {"edge-8080": 9} and len(marks) == 1


async def test_a_restarted_ingress_takes_its_lost_predecessor_s_place() -> None:
    """A new process of an ingress (a new instance) while the old one's channel lingers: the
    old one counts no more, and nobody is told of a second ingress."""
    marks = Marks(settle=0)
    old, new = object(), object()
    marks.saw(old, "edge-1", 3, instance="aa")
    marks.gone(old)  # killed: its channel closed without a word
    assert marks.behind(10) == {"edge-1": 3}
    assert marks.saw(new, "edge-1", 10, instance="bb") is None
    assert marks.behind(10) == {} and len(marks) == 1


async def test_three_of_one_name_and_one_of_another_scope_are_four() -> None:
    marks = Marks(settle=0)
    holders = [object() for _ in range(4)]
    assert marks.saw(holders[0], "edge", 1, "token:a", "01") is None
    assert marks.saw(holders[1], "edge", 1, "token:a", "02") == "edge (02)"
    assert marks.saw(holders[2], "edge", 1, "token:a", "03") == "edge (03)"
    assert marks.saw(holders[3], "edge", 1, "token:b", "04") is None
    assert len(marks) == 4
    assert marks.behind(2) == {"edge (01)": 1, "edge (02)": 1, "edge (03)": 1, "edge": 1}


async def test_a_holder_flipping_instance_ids_is_warned_of_once() -> None:
    """A hostile ingress token's channel that changes its instance at every report beside a
    live ingress of the name: one warning, not one a report, and one entry, not many."""
    marks = Marks(settle=0)
    live, flipping = object(), object()
    marks.saw(live, "edge", 1, instance="aa")
    said = [marks.saw(flipping, "edge", 1 + n, instance=f"{n:x}") for n in range(1, 100)]
    assert said[0] == "edge (1)" and said[1:] == [None] * 98
    assert len(marks) == 2
