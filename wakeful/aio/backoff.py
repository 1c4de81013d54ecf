"""The async side of `wakeful.domain.backoff`: call something until it succeeds, sleeping the
policy's pause after each failure.

`retry` is for a call that is either done or failed (a listing at start, a fetch). A loop that
keeps running between failures (a watch, a flush every second, a fence re-applied on change)
keeps a `Retries` of its own and sleeps `retries.failed()` where it fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from wakeful.domain.backoff import Backoff, Retries

T = TypeVar("T")


async def retry(
    call: Callable[[], Awaitable[T]],
    policy: Backoff,
    *,
    errors: tuple[type[Exception], ...],
    tries: int | None = None,
    failed: Callable[[Exception, float], None] | None = None,
) -> T:
    """`call()`'s result, calling it again after a pause while it raises one of `errors`.
    `tries`: at most this many calls, the last one's error raised (None: until it succeeds or
    the caller is cancelled). `failed(exc, pause)` is told of each failure before its pause
    (to log it)."""
    retries = Retries(policy)
    while True:
        try:
            return await call()
        except errors as exc:
            if tries is not None and retries.failures + 1 >= tries:
                raise
            pause = retries.failed()
            if failed is not None:
                failed(exc, pause)
            await anyio.sleep(pause)
