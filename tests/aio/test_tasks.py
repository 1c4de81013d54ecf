"""`Background`: tasks started from synchronous code, held until they end."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from wakeful.aio.tasks import Background

pytestmark = pytest.mark.anyio


async def test_a_task_is_held_until_it_ends_and_its_failure_goes_to_failed() -> None:
    failures: list[str] = []
    background = Background(lambda exc: failures.append(str(exc)))
    gate = anyio.Event()

    async def fails() -> None:
        await gate.wait()
        raise OSError("the slot's tree could not be removed")

    background.spawn(fails())
    assert len(background) == 1
    gate.set()
    with pytest.raises(OSError, match="could not be removed"):
        await background.wait()
    assert len(background) == 0
    assert failures == ["the slot's tree could not be removed"]


async def test_without_failed_a_failure_is_dropped_and_never_logged_as_unretrieved() -> None:
    background = Background()

    async def fails() -> None:
        raise OSError("gone")

    task = background.spawn(fails())
    with pytest.raises(OSError, match="gone"):
        await background.wait()
    assert task.done() and len(background) == 0


async def test_a_cancelled_task_is_no_failure() -> None:
    failures: list[BaseException] = []
    background = Background(failures.append)
    task = background.spawn(anyio.sleep_forever())
    await anyio.lowlevel.checkpoint()
    task.cancel()
    await anyio.sleep(0.01)
    assert len(background) == 0 and failures == []


async def test_wait_with_nothing_started_returns_at_once() -> None:
    with anyio.fail_after(1):
        await Background().wait()
