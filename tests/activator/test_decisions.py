"""Table tests of the pure admission and sizing core (seed 000)."""

from __future__ import annotations

import pytest

from wakeful.activator.decisions import (
    Admit,
    Candidate,
    Gate,
    Park,
    Step,
    admit,
    demanded_instances,
    expired,
    lease_size,
    plan_scale_up,
    scale_up_gate,
    to_thaw,
)
from wakeful.domain.leases import short


def sandboxes(*leased: int) -> list[Candidate]:
    return [Candidate(f"s{i}", f"http://127.0.0.1:{9000 + i}", n) for i, n in enumerate(leased)]


@pytest.mark.parametrize(
    ("candidates", "mode", "rpi", "expected"),
    [
        pytest.param([], "auto", 10, Park(), id="nothing routable parks"),
        pytest.param(
            sandboxes(0),
            "auto",
            10,
            Admit("s0", "http://127.0.0.1:9000", 2, False),
            id="room on one sandbox takes a normal lease of rpi//5",
        ),
        pytest.param(
            sandboxes(8, 4),
            "auto",
            10,
            Admit("s1", "http://127.0.0.1:9001", 2, False),
            id="the least-loaded sandbox with room is chosen",
        ),
        pytest.param(
            sandboxes(9, 2),
            "auto",
            10,
            Admit("s1", "http://127.0.0.1:9001", 2, False),
            id="a sandbox without room for a whole lease is skipped",
        ),
        pytest.param(
            sandboxes(10, 9, 12),
            "auto",
            10,
            Admit("s1", "http://127.0.0.1:9001", 1, True),
            id="every sandbox at target gets an overflow lease of 1 on the least loaded",
        ),
        pytest.param(
            sandboxes(5),
            "auto",
            5,
            Admit("s0", "http://127.0.0.1:9000", 1, True),
            id="rpi 5 leases of 1 overflow at 5",
        ),
        pytest.param(
            sandboxes(40, 3),
            "fixed",
            1,
            Admit("s1", "http://127.0.0.1:9001", 1, False),
            id="fixed mode spreads size-1 leases without a cap",
        ),
    ],
)
def test_admission(
    candidates: list[Candidate], mode: str, rpi: int, expected: Admit | Park
) -> None:
    assert admit(candidates, mode, rpi) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("candidates", "mode", "rpi", "hard", "expected"),
    [
        pytest.param(
            sandboxes(3, 3), "auto", 2, 3, Park(), id="every sandbox at its hard limit parks"
        ),
        pytest.param(
            sandboxes(3, 2),
            "auto",
            2,
            3,
            Admit("s1", "http://127.0.0.1:9001", 1, True),
            id="past the target, overflow only onto a sandbox below the hard limit",
        ),
        pytest.param(
            sandboxes(9, 0),
            "auto",
            10,
            10,
            Admit("s1", "http://127.0.0.1:9001", 2, False),
            id="below the target a normal lease as before",
        ),
        pytest.param(
            sandboxes(9, 9),
            "auto",
            10,
            10,
            Admit("s0", "http://127.0.0.1:9000", 1, True),
            id="no room for a whole lease: an overflow lease of 1, still under the cap",
        ),
        pytest.param(
            sandboxes(1, 1), "fixed", 1, 1, Park(), id="fixed mode parks at the hard limit too"
        ),
        pytest.param([], "auto", 10, 10, Park(), id="nothing routable parks, as without a limit"),
    ],
)
def test_admission_under_a_hard_limit(
    candidates: list[Candidate], mode: str, rpi: int, hard: int, expected: Admit | Park
) -> None:
    """Invariant 1 as amended: a request waits only when no routable sandbox is below its
    hard limit, and no lease takes a sandbox past it."""
    decision = admit(candidates, mode, rpi, hard)  # type: ignore[arg-type]
    assert decision == expected
    if isinstance(decision, Admit):
        chosen = next(c for c in candidates if c.sandbox_id == decision.sandbox_id)
        assert chosen.leased + decision.size <= hard


@pytest.mark.parametrize(
    ("mode", "rpi", "size"),
    [("auto", 10, 2), ("auto", 4, 1), ("auto", 100, 20), ("fixed", 100, 1)],
    ids=["rpi 10 gives 2", "rpi 4 gives 1", "rpi 100 gives 20", "fixed gives 1"],
)
def test_lease_size(mode: str, rpi: int, size: int) -> None:
    assert lease_size(mode, rpi) == size  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("leased", "waiters", "size", "rpi", "desired", "cap", "expected"),
    [
        pytest.param(
            0, 35, 1, 5, 1, 20, 8, id="35 waiters at target 5 with nothing leased ask for 8"
        ),
        pytest.param(0, 1, 1, 5, 0, 20, 1, id="one waiter on a pool at zero asks for 1"),
        pytest.param(20, 0, 2, 10, 2, 20, 3, id="20 leased at target 10 plus headroom asks for 3"),
        pytest.param(0, 0, 2, 10, 6, 20, 6, id="the target never shrinks desired"),
        pytest.param(0, 500, 1, 5, 3, 20, 20, id="the cap holds"),
        pytest.param(0, 1, 20, 100, 0, 20, 1, id="at least 1 when something waits"),
    ],
)
def test_demanded_instances(
    leased: int, waiters: int, size: int, rpi: int, desired: int, cap: int, expected: int
) -> None:
    assert (
        demanded_instances(
            leased=leased,
            waiters=waiters,
            lease_size=size,
            requests_per_instance=rpi,
            desired=desired,
            max_instances=cap,
        )
        == expected
    )


@pytest.mark.parametrize(
    ("leased", "waiters", "size", "rpi", "routable", "thawing", "suspended", "expected"),
    [
        pytest.param(0, 1, 1, 5, 0, 0, 3, 1, id="one waiter thaws one of three"),
        pytest.param(0, 35, 1, 5, 0, 0, 3, 3, id="35 waiters at target 5 thaw all three"),
        pytest.param(0, 1, 1, 5, 1, 0, 3, 1, id="a waiter means nothing routable has room"),
        pytest.param(0, 3, 1, 5, 0, 1, 2, 0, id="three waiters fit the one thawing already"),
        pytest.param(0, 8, 1, 5, 0, 1, 2, 1, id="eight do not: one more"),
        pytest.param(10, 0, 2, 10, 1, 0, 2, 1, id="an overflow at target thaws one more"),
        pytest.param(3, 0, 2, 10, 1, 0, 2, 0, id="room left: nothing thaws"),
        pytest.param(0, 4, 1, 5, 0, 0, 0, 0, id="nothing suspended: the scale-up's job"),
    ],
)
def test_to_thaw(
    leased: int,
    waiters: int,
    size: int,
    rpi: int,
    routable: int,
    thawing: int,
    suspended: int,
    expected: int,
) -> None:
    assert (
        to_thaw(
            leased=leased,
            waiters=waiters,
            lease_size=size,
            requests_per_instance=rpi,
            routable=routable,
            thawing=thawing,
            suspended=suspended,
        )
        == expected
    )


@pytest.mark.parametrize(
    ("in_flight", "now", "backoff_until", "desired", "cap", "reread", "expected"),
    [
        pytest.param(True, 0, 0, 1, 20, False, Gate.IN_FLIGHT, id="one in flight stops the rest"),
        pytest.param(False, 5, 10, 1, 20, False, Gate.BACKOFF, id="backoff after a failure"),
        pytest.param(False, 5, 0, 20, 20, False, Gate.CAPPED, id="at the cap with no re-read"),
        pytest.param(False, 5, 0, 20, 20, True, Gate.PROCEED, id="at the cap with a re-read due"),
        pytest.param(False, 5, 0, 3, 20, False, Gate.PROCEED, id="room to grow proceeds"),
    ],
)
def test_scale_up_gate(
    in_flight: bool,
    now: float,
    backoff_until: float,
    desired: int,
    cap: int,
    reread: bool,
    expected: Gate,
) -> None:
    gate = scale_up_gate(
        in_flight=in_flight,
        now=now,
        backoff_until=backoff_until,
        desired=desired,
        max_instances=cap,
        reread_due=reread,
    )
    assert gate is expected


@pytest.mark.parametrize(
    ("desired", "live", "now", "last_reread", "expected"),
    [
        pytest.param(1, 1, 100, 0, Step.WRITE, id="demand above desired writes"),
        pytest.param(
            5, 0, 100, 0, Step.REREAD, id="covered but fewer live than the cache claims re-reads"
        ),
        pytest.param(5, 0, 100, 90, Step.COVERED, id="at most one re-read every 30 s"),
        pytest.param(5, 5, 100, 0, Step.COVERED, id="covered and live does nothing"),
    ],
)
def test_plan_scale_up(
    desired: int, live: int, now: float, last_reread: float, expected: Step
) -> None:
    plan = plan_scale_up(
        leased=10,
        waiters=5,
        lease_size=2,
        requests_per_instance=10,
        desired=desired,
        max_instances=20,
        live=live,
        now=now,
        last_reread=last_reread,
    )
    assert plan.step is expected
    assert plan.target >= desired


def test_expired_picks_only_passed_deadlines() -> None:
    assert expired({"a": 10.0, "b": 10.5, "c": 9.0}, 10.0) == ["a", "c"]


@pytest.mark.parametrize(
    ("short_at", "now", "waiting", "expected"),
    [
        (None, 100.0, 0, False),
        (100.0, 100.0, 0, True),
        (100.0, 109.9, 0, True),
        (100.0, 110.0, 0, False),
        (100.0, 500.0, 0, False),
        (100.0, 500.0, 1, True),
        (None, 100.0, 3, True),
    ],
    ids=[
        "never short",
        "short the moment a request got less than a normal lease",
        "still short within SHORT_SECONDS",
        "no longer at SHORT_SECONDS",
        "long after",
        "long after, but a request of it still waits",
        "requests wait",
    ],
)
def test_short(short_at: float | None, now: float, waiting: int, expected: bool) -> None:
    assert short(short_at, now, waiting) is expected
