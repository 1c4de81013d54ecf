"""`Marks` (`wakeful.aio.marks`): how far each holder says it has come, and a wait until all
have reached a mark; what a deploy waits on for the ingresses' routes."""

from __future__ import annotations

import anyio
import pytest

from wakeful.aio.marks import Marks

pytestmark = pytest.mark.anyio


async def test_a_wait_ends_when_the_last_holder_behind_reaches_the_mark() -> None:
    marks = Marks()
    first, second = object(), object()
    marks.saw(first, "edge-1", 10)
    marks.saw(second, "edge-2", 7)
    assert marks.behind(10) == {"edge-2": 7} and len(marks) == 2
    assert await marks.wait(7, within=0) == {}  # both there already: no wait at all
    done: list[dict[str, int]] = []

    async def waiting() -> None:
        done.append(await marks.wait(10, within=60))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(waiting)
        await anyio.sleep(0.01)
        marks.saw(second, "edge-2", 9)  # moved, still behind: the wait goes on
        await anyio.sleep(0.01)
        assert done == []
        marks.saw(second, "edge-2", 12)
    assert done == [{}]


async def test_a_holder_that_goes_holds_no_wait_up_and_marks_only_move_on() -> None:
    marks = Marks()
    held, gone = object(), object()
    marks.saw(held, "edge-1", 10)
    marks.saw(held, "edge-1", 4)  # a late, lower mark changes nothing
    assert marks.behind(10) == {}
    marks.saw(gone, "edge-2", 3)
    done: list[dict[str, int]] = []

    async def waiting() -> None:
        done.append(await marks.wait(10, within=60))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(waiting)
        await anyio.sleep(0.01)
        assert done == []
        marks.gone(gone)
    assert done == [{}] and len(marks) == 1
    marks.gone(gone)  # again: harmless


async def test_a_wait_gives_up_after_its_time_naming_who_is_behind() -> None:
    """Two holders under one name (an ingress's old channel beside its new one): the name
    is behind with the lower mark."""
    marks = Marks()
    marks.saw(object(), "edge-1", 5)
    marks.saw(object(), "edge-1", 8)
    marks.saw(object(), "edge-2", 20)
    with anyio.fail_after(10):
        assert await marks.wait(10, within=0.05) == {"edge-1": 5}
