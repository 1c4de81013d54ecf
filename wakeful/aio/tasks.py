"""Tasks started from synchronous code, where no task group is at hand.

A protocol callback or a future's done callback cannot `await` and has no task group; the work
it starts (a lease handed back, a warm slot discarded) runs as a task of its own. The event
loop keeps only a weak reference to a task, so one nobody holds may be collected before it
ends: `Background` holds each until it ends, and hands what it raised to `failed` (dropped
when there is none: work whose failure nobody can act on). Whoever owns a `Background` may
wait for what is left (`wait`) when it shuts down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class Background:
    def __init__(self, failed: Callable[[BaseException], None] | None = None) -> None:
        self._failed = failed
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, object]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def __len__(self) -> int:
        """Tasks not ended yet."""
        return len(self._tasks)

    async def wait(self) -> None:
        """Until every task started so far has ended; raises what the first of them to fail
        raised (after `failed` was told)."""
        await asyncio.gather(*self._tasks)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved either way: never logged as unretrieved
        if exc is not None and self._failed is not None:
            self._failed(exc)
