"""`retry`: a call made again, after the policy's pause, while it fails."""

from __future__ import annotations

import pytest

from wakeful.aio.backoff import retry
from wakeful.domain.backoff import Backoff

pytestmark = pytest.mark.anyio

QUICK = Backoff(0.001, cap=0.004)


class Flaky:
    """Fails with `error` `failures` times, then answers "done"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.left = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.error
        return "done"


async def test_a_call_that_fails_is_made_again_after_each_pause_until_it_succeeds() -> None:
    call = Flaky(4, OSError("away"))
    told: list[tuple[str, float]] = []
    result = await retry(
        call, QUICK, errors=(OSError,), failed=lambda exc, pause: told.append((str(exc), pause))
    )
    assert result == "done" and call.calls == 5
    assert told == [("away", 0.001), ("away", 0.002), ("away", 0.004), ("away", 0.004)]


async def test_with_tries_the_last_failure_is_raised() -> None:
    call = Flaky(5, OSError("away"))
    with pytest.raises(OSError, match="away"):
        await retry(call, QUICK, errors=(OSError,), tries=3)
    assert call.calls == 3


async def test_one_try_is_one_call() -> None:
    call = Flaky(1, OSError("away"))
    with pytest.raises(OSError, match="away"):
        await retry(call, QUICK, errors=(OSError,), tries=1)
    assert call.calls == 1


async def test_an_error_it_was_not_told_to_retry_is_raised_at_once() -> None:
    call = Flaky(1, ValueError("bad input"))
    with pytest.raises(ValueError, match="bad input"):
        await retry(call, QUICK, errors=(OSError,))
    assert call.calls == 1
