"""`Pipe`: bytes from a protocol to its consumer, in order, bounded by pausing the protocol."""

from __future__ import annotations

import anyio
import pytest

from wakeful.aio.flow import HIGH_WATER, LOW_WATER
from wakeful.aio.pipe import Pipe

pytestmark = pytest.mark.anyio


class Reading:
    """A transport's reading switch, as the pipe sees it: every call recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pipe(self, **bounds: int) -> Pipe:
        return Pipe(
            lambda: self.calls.append("pause"), lambda: self.calls.append("resume"), **bounds
        )


async def test_chunks_come_out_in_order_then_empty_bytes_once_it_ended() -> None:
    pipe = Reading().pipe()
    pipe.feed(b"one")
    pipe.feed(b"")  # nothing: not a chunk, and not the end
    pipe.feed(b"two")
    pipe.end()
    pipe.feed(b"late")  # after the end: dropped
    assert [await pipe.get(), await pipe.get(), await pipe.get(), await pipe.get()] == [
        b"one",
        b"two",
        b"",
        b"",
    ]


async def test_past_high_water_the_protocol_pauses_once_and_resumes_at_low_water() -> None:
    reading = Reading()
    pipe = reading.pipe()
    chunk = b"x" * (HIGH_WATER // 4)
    for _ in range(5):  # 5/4 of the mark
        pipe.feed(chunk)
    assert reading.calls == ["pause"]
    for _ in range(3):
        await pipe.get()
    assert reading.calls == ["pause"]  # half the mark still waits
    await pipe.get()
    assert pipe.size == LOW_WATER
    assert reading.calls == ["pause", "resume"]
    pipe.feed(chunk)
    assert reading.calls == ["pause", "resume"]  # half the mark: reading goes on


async def test_get_with_a_limit_joins_chunks_and_cuts_the_one_that_does_not_fit() -> None:
    pipe = Reading().pipe()
    for chunk in (b"abc", b"defg", b"hi"):
        pipe.feed(chunk)
    assert await pipe.get(5) == b"abcde"
    assert pipe.size == 4
    assert await pipe.get(5) == b"fghi"


async def test_get_waits_for_bytes_or_the_end() -> None:
    pipe = Reading().pipe()
    got: list[bytes] = []
    async with anyio.create_task_group() as tasks:

        async def consume() -> None:
            got.append(await pipe.get())
            got.append(await pipe.get())

        tasks.start_soon(consume)
        await anyio.sleep(0.01)
        assert got == []
        pipe.feed(b"hello")
        await anyio.sleep(0.01)
        assert got == [b"hello"]
        pipe.end()
    assert got == [b"hello", b""]


@pytest.mark.parametrize(
    ("fed", "ended", "expected"),
    [
        pytest.param([], False, None, id="nothing yet: None"),
        pytest.param([b"a", b"b"], False, b"a", id="a chunk: the first"),
        pytest.param([], True, b"", id="ended and read: empty bytes"),
        pytest.param([b"a"], True, b"a", id="ended with a chunk left: the chunk first"),
    ],
)
def test_get_nowait(fed: list[bytes], ended: bool, expected: bytes | None) -> None:
    pipe = Reading().pipe()
    for chunk in fed:
        pipe.feed(chunk)
    if ended:
        pipe.end()
    assert pipe.get_nowait() == expected


def test_bounds_that_would_never_resume_are_refused() -> None:
    with pytest.raises(ValueError, match="low < high"):
        Reading().pipe(high=10, low=10)
