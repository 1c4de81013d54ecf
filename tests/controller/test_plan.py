from __future__ import annotations

import pytest

from wakeful.controller.plan import Create, Drain, MarkDead, Remove, Stop, cooldown, plan_pool
from wakeful.domain.models import AppSpec, Node, Pool, Sandbox
from wakeful.domain.models import SandboxStatus as S

SPEC = AppSpec(command=["serve"])


def pool(desired: int, *, cooldown_until: float = 0.0, retired: bool = False) -> Pool:
    return Pool(
        name="p",
        app="a",
        version="v1",
        spec=SPEC,
        desired_instances=desired,
        crash_cooldown_until=cooldown_until,
        retired=retired,
    )


def sb(
    sid: str, status: S, *, node: str = "n1", activity: float = 0.0, address: str | None = None
) -> Sandbox:
    running = status in (S.RUNNING, S.DRAINING)
    return Sandbox(
        id=sid,
        pool="p",
        app="a",
        node=node,
        status=status,
        ready=status is S.RUNNING,
        address=address or ("127.0.0.1:1" if running else None),
        last_activity=activity,
    )


NODES = [Node(name="n1", address="a"), Node(name="n2", address="b")]


@pytest.mark.parametrize(
    ("desired", "sandboxes", "leased", "expected"),
    [
        pytest.param(2, [], {}, [Create("n1"), Create("n2")], id="grow onto the emptiest nodes"),
        pytest.param(
            1,
            [sb("a", S.RUNNING), sb("b", S.RUNNING, activity=5)],
            {"b": 0},
            [Drain("a")],
            id="shrink drains the oldest idle running sandbox",
        ),
        pytest.param(
            1,
            [sb("a", S.RUNNING), sb("b", S.RUNNING, activity=5)],
            {"a": 2},
            [Drain("b")],
            id="a sandbox holding leases is drained last",
        ),
        pytest.param(
            1,
            [sb("a", S.RUNNING), sb("b", S.BOOTING)],
            {},
            [Stop("b")],
            id="booting ones go before running ones",
        ),
        pytest.param(
            0,
            [sb("a", S.DRAINING)],
            {"a": 1},
            [],
            id="a draining sandbox with leases is not stopped",
        ),
        pytest.param(
            0,
            [sb("a", S.DRAINING)],
            {},
            [Stop("a")],
            id="a draining sandbox with no leases is stopped",
        ),
        pytest.param(
            1,
            [sb("a", S.DEAD)],
            {},
            [Remove("a", True), Create("n1")],
            id="a crashed sandbox is removed and replaced",
        ),
        pytest.param(
            1,
            [sb("a", S.RUNNING, node="gone")],
            {},
            [MarkDead("a", "node gone is gone"), Create("n1")],
            id="a sandbox on a dead node is dead",
        ),
    ],
)
def test_plan(
    desired: int, sandboxes: list[Sandbox], leased: dict[str, int], expected: list[object]
) -> None:
    assert plan_pool(pool(desired), sandboxes, leased, NODES, {}, now=100) == expected


def test_no_new_sandboxes_during_a_crash_cooldown() -> None:
    assert plan_pool(pool(2, cooldown_until=150), [], {}, NODES, {}, now=100) == []
    assert plan_pool(pool(1, cooldown_until=50), [], {}, NODES, {}, now=100) == [Create("n1")]


def test_cordoned_nodes_take_nothing_and_a_retired_pool_goes_to_zero() -> None:
    cordoned = [Node(name="n1", address="a", cordoned=True), Node(name="n2", address="b")]
    assert plan_pool(pool(2), [], {}, cordoned, {}, now=0) == [Create("n2"), Create("n2")]
    assert plan_pool(pool(3, retired=True), [sb("a", S.RUNNING)], {}, NODES, {}, now=0) == [
        Drain("a")
    ]


@pytest.mark.parametrize(
    ("count", "seconds"),
    [(1, 1.0), (2, 2.0), (4, 8.0), (20, 60.0)],
    ids=["first", "second", "fourth", "capped"],
)
def test_cooldown_is_exponential_and_capped(count: int, seconds: float) -> None:
    assert cooldown(count) == seconds


EVACUATING = [
    Node(name="n1", address="a", cordoned=True, evacuating=True),
    Node(name="n2", address="b"),
]


def test_evacuation_replaces_first_and_drains_once_the_replacement_serves() -> None:
    on_leaving = sb("a", S.RUNNING, node="n1")
    # The replacement does not exist yet: create it on n2; a keeps serving meanwhile.
    assert plan_pool(pool(1), [on_leaving], {}, EVACUATING, {}, now=0) == [Create("n2")]
    booting = sb("b", S.BOOTING, node="n2")
    assert plan_pool(pool(1), [on_leaving, booting], {}, EVACUATING, {}, now=0) == []
    serving = sb("b", S.RUNNING, node="n2")
    assert plan_pool(pool(1), [on_leaving, serving], {}, EVACUATING, {}, now=0) == [Drain("a")]


def test_evacuation_with_no_adopter_keeps_the_sandbox_serving() -> None:
    alone = [Node(name="n1", address="a", cordoned=True, evacuating=True)]
    assert plan_pool(pool(1), [sb("a", S.RUNNING, node="n1")], {}, alone, {}, now=0) == []


def test_a_cordon_without_evacuation_keeps_what_runs_and_places_nothing_new() -> None:
    cordoned = [Node(name="n1", address="a", cordoned=True), Node(name="n2", address="b")]
    assert plan_pool(pool(2), [sb("a", S.RUNNING, node="n1")], {}, cordoned, {}, now=0) == [
        Create("n2")
    ]
