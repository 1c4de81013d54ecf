"""Waiting for what lands asynchronously: `eventually` polls a condition under a deadline, so a
test never sleeps a guessed time and never waits for ever. The one such helper the tests use;
a wait for something with an event of its own waits on that event instead."""

from __future__ import annotations

from collections.abc import Callable

import anyio


async def eventually(check: Callable[[], object], within: float = 30.0) -> None:
    """Wait until `check()` is true, yielding to the loop (5 ms) in between; TimeoutError after
    `within` seconds (generous: only a failing test waits that long, and a loaded machine
    must not fail a passing one)."""
    with anyio.fail_after(within):
        while not check():  # noqa: ASYNC110 - what is checked has no event to wait on
            await anyio.sleep(0.005)
