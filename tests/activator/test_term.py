"""When an activator may grant and suspend (`activator/term.py`)."""

from __future__ import annotations

import pytest

from wakeful.activator.term import Term
from wakeful.domain.leases import Unreachable
from wakeful.testing import ManualClock

TTL = 60.0


@pytest.mark.parametrize(
    ("took_over", "opened", "deposed", "after", "may"),
    [
        pytest.param(False, True, False, 0.0, True, id="a first leader suspends once admitting"),
        pytest.param(False, False, False, 3600.0, False, id="nothing before admission opens"),
        pytest.param(
            True, True, False, TTL - 1, False, id="not during a takeover's lease TTL after opening"
        ),
        pytest.param(True, True, False, TTL, True, id="a takeover's lease TTL later it may"),
        pytest.param(False, True, True, 3600.0, False, id="never once deposed"),
    ],
)
def test_may_suspend(took_over: bool, opened: bool, deposed: bool, after: float, may: bool) -> None:
    clock = ManualClock(100.0)
    term = Term(lease_ttl=TTL, clock=clock, leading=lambda: True)
    term.took_over = took_over
    if opened:
        assert term.open_admission()
        assert not term.open_admission()  # once
    if deposed:
        term.deposed.set()
    clock.advance(after)
    assert term.may_suspend() is may


@pytest.mark.parametrize(
    ("leading", "deposed"),
    [
        pytest.param(False, False, id="a term that is not certainly current grants nothing"),
        pytest.param(True, True, id="a deposed activator grants nothing"),
    ],
)
def test_check_refuses_once_not_leading(leading: bool, deposed: bool) -> None:
    term = Term(lease_ttl=TTL, clock=ManualClock(), leading=lambda: leading)
    if deposed:
        term.deposed.set()
    with pytest.raises(Unreachable, match="stopped leading"):
        term.check()


def test_check_passes_while_leading() -> None:
    Term(lease_ttl=TTL, clock=ManualClock(), leading=lambda: True).check()
