"""The one backoff policy (`wakeful.domain.backoff`): the pause after failures in a row."""

from __future__ import annotations

import math

import pytest

from wakeful.domain.backoff import Backoff, Retries


@pytest.mark.parametrize(
    ("policy", "failures", "pause"),
    [
        pytest.param(Backoff(0.5, cap=5.0), 0, 0.0, id="no failure yet: no pause"),
        pytest.param(Backoff(0.5, cap=5.0), 1, 0.5, id="the first failure waits first"),
        pytest.param(Backoff(0.5, cap=5.0), 2, 1.0, id="the second waits twice as long"),
        pytest.param(Backoff(0.5, cap=5.0), 4, 4.0, id="the fourth waits eight times first"),
        pytest.param(Backoff(0.5, cap=5.0), 5, 5.0, id="the fifth would wait 8 s: held to the cap"),
        pytest.param(Backoff(0.5, cap=30.0), 10_000, 30.0, id="ten thousand failures: the cap"),
        pytest.param(Backoff(0.5), 4, 4.0, id="without a cap it keeps doubling"),
        pytest.param(Backoff(0.5), 5_000, math.inf, id="without a cap it overflows to forever"),
        pytest.param(Backoff(1.0, factor=3.0), 3, 9.0, id="a factor of 3 triples each time"),
        pytest.param(Backoff(2.0, factor=1.0), 7, 2.0, id="a factor of 1 is a fixed pause"),
        pytest.param(Backoff(0.0, cap=15.0), 9, 0.0, id="a first of 0 never waits"),
        pytest.param(Backoff(5.0, cap=5.0), 3, 5.0, id="first at the cap stays there"),
    ],
)
def test_the_pause_after_failures_in_a_row(policy: Backoff, failures: int, pause: float) -> None:
    assert policy.delay(failures) == pause


@pytest.mark.parametrize(
    ("first", "cap", "factor"),
    [
        pytest.param(-1.0, 5.0, 2.0, id="a negative first pause"),
        pytest.param(6.0, 5.0, 2.0, id="a first pause over the cap"),
        pytest.param(0.5, 5.0, 0.5, id="a factor that shrinks the pause"),
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(first: float, cap: float, factor: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(first, cap, factor)


def test_retries_count_failures_in_a_row_and_a_success_starts_again() -> None:
    retries = Retries(Backoff(0.5, cap=2.0))
    assert [retries.failed() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    retries.succeeded()
    assert retries.failures == 0
    assert retries.failed() == 0.5
