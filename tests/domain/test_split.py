"""A traffic split's rules (`wakeful.domain.split`): the weights a user gives, the even spread
every ingress applies, a ramp's steps, the rollback verdict, tag names."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from wakeful.domain.models import App
from wakeful.domain.split import (
    MAX_STEP,
    SplitError,
    Spread,
    Thresholds,
    Window,
    newest_in_split,
    parse_split,
    ramp_plan,
    routed,
    tag_problem,
    verdict,
    with_split,
)

VERSIONS = ["v6", "v7", "v8"]


@pytest.mark.parametrize(
    ("arguments", "weights"),
    [
        pytest.param(["v7=90", "v8=10"], {"v7": 90, "v8": 10}, id="two versions"),
        pytest.param(["v7=90", "latest=10"], {"v7": 90, "v8": 10}, id="latest is the newest"),
        pytest.param(["v8=100"], {"v8": 100}, id="all to one"),
        pytest.param(["v6=0", "v8=100"], {"v6": 0, "v8": 100}, id="a version at 0"),
    ],
)
def test_a_split_as_given(arguments: list[str], weights: dict[str, int]) -> None:
    assert parse_split(arguments, VERSIONS, "v8") == weights


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        pytest.param(["v7"], "give VERSION=PERCENT", id="no percent"),
        pytest.param(["v9=100"], "v9 is not a deployed version", id="an unknown version"),
        pytest.param(["v7=50", "v7=50"], "v7 is given twice", id="twice"),
        pytest.param(["v7=50", "latest=50"], "'latest=50'", id="latest is v7 here: twice"),
        pytest.param(["v7=-1", "v8=101"], "whole number from 0 to 100", id="out of range"),
        pytest.param(["v7=9.5", "v8=90.5"], "whole number", id="not whole"),
        pytest.param(["v7=90", "v8=20"], "add up to 110, not 100", id="not 100"),
        pytest.param([], "at least one", id="nothing"),
    ],
)
def test_a_split_that_cannot_be_applied_is_refused_naming_the_argument(
    arguments: list[str], said: str
) -> None:
    with pytest.raises(SplitError, match=said):
        parse_split(arguments, VERSIONS, "v7" if "latest=50" in arguments else "v8")


WEIGHT_SETS = [
    {"a": 90, "b": 10},
    {"a": 50, "b": 50},
    {"a": 99, "b": 1},
    {"a": 1, "b": 99},
    {"a": 33, "b": 33, "c": 34},
    {"a": 70, "b": 20, "c": 10},
    {"a": 0, "b": 100},
    {"a": 5, "b": 0, "c": 95},
    {"a": 25, "b": 25, "c": 25, "d": 25},
    {"a": 97, "b": 1, "c": 1, "d": 1},
]


@pytest.mark.parametrize("weights", WEIGHT_SETS, ids=lambda w: "/".join(map(str, w.values())))
def test_the_spread_is_even_over_every_run_of_requests(weights: dict[str, int]) -> None:
    """After every request of 1,000 each version has had its exact share, give or take one."""
    spread = Spread(weights)
    counts = dict.fromkeys(weights, 0)
    for n in range(1, 1001):
        counts[spread.pick()] += 1
        for version, weight in weights.items():
            assert abs(counts[version] - n * weight / 100) < 1 + 1e-9, (n, counts)
    assert counts == {version: weight * 10 for version, weight in weights.items()}


def test_the_spread_interleaves_rather_than_bunching() -> None:
    """90/10: the 10% version comes once in every 10, never twice within 9."""
    spread = Spread({"v7": 90, "v8": 10})
    picks = [spread.pick() for _ in range(200)]
    at = [i for i, version in enumerate(picks) if version == "v8"]
    assert len(at) == 20
    assert all(b - a == 10 for a, b in itertools.pairwise(at))


def test_a_spread_with_no_share_refuses() -> None:
    with pytest.raises(SplitError, match="no version has a share"):
        Spread({"a": 0}).pick()


@pytest.mark.parametrize(
    ("start", "duration", "plan"),
    [
        pytest.param(
            1, 600.0, [(0.0, 1), (150.0, 26), (300.0, 51), (450.0, 75), (600.0, 100)], id="from 1%"
        ),
        pytest.param(
            10,
            300.0,
            [(0.0, 10), (75.0, 32), (150.0, 55), (225.0, 78), (300.0, 100)],
            id="a canary at 10%: 4 steps of at most 25 points",
        ),
        pytest.param(80, 60.0, [(0.0, 80), (60.0, 100)], id="one step"),
        pytest.param(100, 60.0, [(0.0, 100)], id="already all"),
    ],
)
def test_a_ramp_moves_in_equal_steps_to_100(
    start: int, duration: float, plan: list[tuple[float, int]]
) -> None:
    made = ramp_plan(start, duration)
    assert made == plan
    shares = [share for _, share in made]
    assert all(0 < b - a <= MAX_STEP for a, b in itertools.pairwise(shares))


@pytest.mark.parametrize(("start", "duration"), [(0, 60.0), (101, 60.0), (10, 0.0)])
def test_a_ramp_that_cannot_be_made_is_refused(start: int, duration: float) -> None:
    with pytest.raises(SplitError):
        ramp_plan(start, duration)


RULES = Thresholds(max_error_ratio=0.05, max_p99_ratio=2.0, min_requests=50)


@pytest.mark.parametrize(
    ("stable", "new", "why"),
    [
        pytest.param(Window(1000, 0, 0.1), Window(2, 1, 0.1), None, id="too few requests"),
        pytest.param(Window(1000, 10, 0.1), Window(100, 1, 0.1), None, id="equal ratios"),
        pytest.param(Window(1000, 10, 0.1), Window(100, 30, 0.1), "5xx on 30.0%", id="a spike"),
        pytest.param(Window(1000, 0, 0.1), Window(100, 5, 0.1), None, id="5 points: not more"),
        pytest.param(Window(1000, 0, 0.1), Window(100, 0, 0.25), "p99 250 ms", id="p99 only"),
        pytest.param(Window(1000, 0, 0.1), Window(100, 0, 0.19), None, id="p99 under 2x"),
        pytest.param(Window(1000, 0, 0.004), Window(100, 0, 0.01), None, id="p99 2.5x by 6 ms"),
        pytest.param(Window(1000, 0, 0.004), Window(100, 0, 0.03), "p99 30 ms", id="by 26 ms"),
        pytest.param(Window(0, 0, 0.0), Window(100, 0, 5.0), None, id="no stable traffic: p99"),
    ],
)
def test_the_rollback_verdict(stable: Window, new: Window, why: str | None) -> None:
    said = verdict(stable, new, RULES)
    if why is None:
        assert said is None
    else:
        assert said is not None and why in said


@pytest.mark.parametrize(
    ("tag", "problem"),
    [
        pytest.param("beta", None, id="a label"),
        pytest.param("canary-2", None, id="with a dash"),
        pytest.param("be--ta", "'--'", id="two dashes"),
        pytest.param("Beta", "DNS label", id="uppercase"),
        pytest.param("-beta", "DNS label", id="a leading dash"),
        pytest.param("b" * 64, "DNS label", id="too long"),
    ],
)
def test_tag_names(tag: str, problem: str | None) -> None:
    said = tag_problem(tag)
    assert (said is None) if problem is None else (said is not None and problem in said)


WEB = App(name="web", active_version="v7", previous_version="v6", tags={"beta": "v9"})


@pytest.mark.parametrize(
    ("weights", "active", "previous", "split"),
    [
        pytest.param({"v7": 90, "v8": 10}, "v7", "v6", {"v7": 90, "v8": 10}, id="canary"),
        pytest.param({"v8": 100}, "v8", "v7", {}, id="all to one ends the split"),
        pytest.param({"v7": 0, "v8": 100}, "v8", "v7", {}, id="a 0 beside it changes nothing"),
        pytest.param({"v7": 100}, "v7", "v6", {}, id="all to the active one"),
        pytest.param(
            {"v7": 0, "v8": 60, "v9": 40},
            "v8",
            "v6",
            {"v7": 0, "v8": 60, "v9": 40},
            id="active at 0: the largest share is active",
        ),
        pytest.param(
            {"v8": 50, "v9": 50}, "v8", "v6", {"v8": 50, "v9": 50}, id="a tie: the first given"
        ),
    ],
)
def test_with_split(
    weights: dict[str, int], active: str, previous: str, split: dict[str, int]
) -> None:
    after = with_split(WEB, weights)
    assert (after.active_version, after.previous_version, after.split) == (
        active,
        previous,
        split,
    )
    assert after.tags == WEB.tags  # traffic never touches tags
    assert App.model_validate(after.model_dump()) == after  # a record the store takes


def test_routed_versions_are_the_active_one_the_split_and_the_tags() -> None:
    assert routed(WEB) == {"v7", "v9"}
    assert routed(with_split(WEB, {"v7": 0, "v8": 100})) == {"v8", "v9"}
    assert routed(with_split(WEB, {"v7": 99, "v8": 0, "v10": 1})) == {"v7", "v8", "v9", "v10"}


def test_promote_takes_the_newest_version_of_the_split_by_number() -> None:
    assert newest_in_split(WEB) is None
    assert newest_in_split(with_split(WEB, {"v7": 80, "v10": 10, "v9": 10})) == "v10"


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        pytest.param({"split": {"v7": 90, "v8": 20}}, "add up to 110", id="not 100"),
        pytest.param(
            {"split": {"v6": 50, "v8": 50}}, "active version v7 has no share", id="active"
        ),
        pytest.param({"tags": {"a--b": "v7"}}, "holds '--'", id="tag with --"),
    ],
)
def test_an_app_record_with_a_split_or_tags_that_cannot_route_is_refused(
    fields: dict[str, object], said: str
) -> None:
    with pytest.raises(ValidationError, match=said):
        App.model_validate({"name": "web", "active_version": "v7", **fields})
