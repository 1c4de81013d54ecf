from __future__ import annotations

import pytest

from wakeful.controller.plan import (
    Action,
    Create,
    Drain,
    MarkDead,
    Moves,
    Remove,
    Stop,
    TakeBack,
    behind,
    choose_moves,
    cooldown,
    lost_holders,
    plan_pool,
    tally_crashes,
    with_cordon,
)
from wakeful.domain.models import AppSpec, AppState, Cordon, Node, Pool, Sandbox, Tunnel
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
    sid: str,
    status: S,
    *,
    node: str = "n1",
    activity: float = 0.0,
    address: str | None = None,
    frozen: float = 0.0,
    gen: int = 0,
) -> Sandbox:
    running = status in (S.RUNNING, S.DRAINING, S.SUSPENDED)
    return Sandbox(
        id=sid,
        pool="p",
        app="a",
        node=node,
        status=status,
        ready=status in (S.RUNNING, S.SUSPENDED),
        address=address or ("127.0.0.1:1" if running else None),
        last_activity=activity,
        suspended_at=frozen,
        secrets_generation=gen,
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
            1,
            [sb("a", S.RUNNING), sb("b", S.SUSPENDED, frozen=50), sb("c", S.SUSPENDED, frozen=40)],
            {},
            [Stop("c"), Stop("b")],
            id="suspended ones go before running ones, stopped without a drain",
        ),
        pytest.param(
            2,
            [sb("a", S.RUNNING), sb("b", S.SUSPENDED, frozen=50), sb("c", S.SUSPENDED, frozen=40)],
            {},
            [Stop("c")],
            id="the longest suspended goes first",
        ),
        pytest.param(
            1,
            [sb("a", S.RUNNING), sb("b", S.SUSPENDED, frozen=50)],
            {"a": 1, "b": 1},
            [Drain("b")],
            id="a suspended one holding a lease (adopted at a takeover) is drained, not stopped",
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


def test_a_dial_out_node_that_holds_no_tunnel_stream_takes_no_new_sandbox() -> None:
    """Invariant 22: nobody can reach its sandboxes, so a request would only wait for one
    placed there; once it holds a stream again it takes sandboxes like any node."""
    cut_off = Node(name="n1", address="", tunnel=Tunnel(reachable=False))
    reached = Node(name="n1", address="", tunnel=Tunnel(reachable=True))
    other = Node(name="n2", address="b")
    assert plan_pool(pool(2), [], {}, [cut_off, other], {}, now=0) == [Create("n2"), Create("n2")]
    assert plan_pool(pool(2), [], {}, [reached, other], {}, now=0) == [Create("n1"), Create("n2")]
    assert plan_pool(pool(1), [], {}, [cut_off], {}, now=0) == []


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


# -- stateful apps (one writer; moved, not replaced) -------------------------------------------

STATEFUL = AppSpec(command=["serve"], state={"path": "data"}, concurrency={"max_instances": 1})


def stateful_pool(desired: int = 1) -> Pool:
    return Pool(name="p", app="a", version="v1", spec=STATEFUL, desired_instances=desired)


def app_state(node: str | None, epoch: int = 4) -> AppState:
    return AppState(app="a", node=node, epoch=epoch)


EVACUATING = [Node(name="n1", address="a", cordoned=True, evacuating=True), NODES[1]]


def test_a_stateful_sandbox_is_created_only_adopting_a_free_state() -> None:
    first = plan_pool(stateful_pool(), [], {}, NODES, {}, 0.0, state=None)
    assert first == [Create("n1", adopt=0)]
    free = plan_pool(stateful_pool(), [], {}, NODES, {}, 0.0, state=app_state(None))
    assert free == [Create("n1", adopt=4)]
    # Held (the old sandbox still stopping, or a node still archiving): wait, never a second.
    held = plan_pool(stateful_pool(), [], {}, NODES, {}, 0.0, state=app_state("n2"))
    assert held == []


def test_evacuation_moves_a_stateful_sandbox_instead_of_replacing_it_first() -> None:
    running = sb("a", S.RUNNING)
    moves = Moves(now=frozenset({"a"}))
    held = app_state("n1")
    plan = plan_pool(
        stateful_pool(), [running], {"a": 1}, EVACUATING, {}, 0.0, state=held, moves=moves
    )
    assert plan == [Drain("a")]  # gated at once; no Create while it holds the state
    # Not in this tick's budget: it keeps serving where it is.
    assert plan_pool(stateful_pool(), [running], {}, EVACUATING, {}, 0.0, moves=Moves()) == []


def test_a_gated_stateful_sandbox_stops_when_its_leases_end_or_the_grace_passes() -> None:
    gated = sb("a", S.DRAINING).model_copy(update={"draining_since": 100.0})
    moves = Moves(grace=30.0)
    busy = {"a": 2}
    assert plan_pool(stateful_pool(), [gated], busy, EVACUATING, {}, 120.0, moves=moves) == []
    assert plan_pool(stateful_pool(), [gated], busy, EVACUATING, {}, 130.0, moves=moves) == [
        Stop("a")
    ]
    assert plan_pool(stateful_pool(), [gated], {}, EVACUATING, {}, 101.0, moves=moves) == [
        Stop("a")
    ]


def test_with_no_node_to_move_to_a_stateful_sandbox_stays_and_serves() -> None:
    alone = [Node(name="n1", address="a", cordoned=True, evacuating=True)]
    moves = Moves(now=frozenset({"a"}))
    assert plan_pool(stateful_pool(), [sb("a", S.RUNNING)], {}, alone, {}, 0.0, moves=moves) == []


def test_a_state_held_by_a_node_gone_long_enough_is_taken_back() -> None:
    """A node back soon hands back what its killed run left (the app's latest writes): only
    once it has been gone for the reconciler's `takeback_after` is its state taken back."""
    held = app_state("n1")
    assert plan_pool(stateful_pool(), [], {}, NODES[1:], {}, 0.0, state=held) == []
    lost = Moves(lost=frozenset({"n1"}))
    plan = plan_pool(stateful_pool(), [], {}, NODES[1:], {}, 0.0, state=held, moves=lost)
    assert plan == [TakeBack("a", "n1")]
    assert plan_pool(stateful_pool(), [], {}, NODES, {}, 0.0, state=held, moves=lost) == []


def test_any_stateful_sandbox_leaving_service_waits_its_grace_at_most() -> None:
    """Scaled down, or its pool retired by a deploy: the next sandbox cannot start before it
    stops, so a long request on it does not hold the app's waiters past the grace."""
    leaving = sb("a", S.DRAINING).model_copy(update={"draining_since": 100.0})
    moves = Moves(grace=30.0)
    assert plan_pool(stateful_pool(0), [leaving], {"a": 1}, NODES, {}, 129.0, moves=moves) == []
    assert plan_pool(stateful_pool(0), [leaving], {"a": 1}, NODES, {}, 130.0, moves=moves) == [
        Stop("a")
    ]
    stateless = pool(0)
    assert plan_pool(stateless, [leaving], {"a": 1}, NODES, {}, 999.0, moves=moves) == []


def test_moves_start_with_what_does_not_serve_then_the_idlest_within_the_budget() -> None:
    sandboxes = [
        sb("busy", S.RUNNING, activity=1),
        sb("idle", S.RUNNING, activity=5),
        sb("older", S.RUNNING, activity=2),
        sb("booting", S.BOOTING),
        sb("elsewhere", S.RUNNING, node="n2"),
    ]
    leased = {"busy": 3}
    assert choose_moves(sandboxes, leased, {"n1"}, 2) == {"booting", "older"}
    assert choose_moves(sandboxes, leased, {"n1"}, 10) == {"booting", "older", "idle", "busy"}
    # Moves under way count against the budget.
    moving = [*sandboxes, sb("gated", S.DRAINING)]
    assert choose_moves(moving, leased, {"n1"}, 2) == {"booting"}


def test_after_undo_nothing_new_moves_and_a_gated_one_finishes_its_move() -> None:
    """`wakeful drain NODE --undo` mid-run: the node is no longer evacuating, so no sandbox is
    gated any more; one already gated ends as any drain does (stopped once its leases end,
    its state handed back), then wakes on whichever node is emptiest, this one included."""
    uncordoned = NODES
    running, gated = sb("a", S.RUNNING), sb("b", S.DRAINING)
    moves = Moves(now=frozenset({"a"}))
    assert plan_pool(stateful_pool(), [running], {}, uncordoned, {}, 0.0, moves=moves) == []
    assert plan_pool(stateful_pool(), [gated], {"b": 1}, uncordoned, {}, 99.0, moves=moves) == []
    assert plan_pool(stateful_pool(), [gated], {}, uncordoned, {}, 99.0, moves=moves) == [Stop("b")]


def crashed_sb(sid: str, log: str = "boom") -> Sandbox:
    """Dead before it was ever ready, as its node reported it."""
    return Sandbox(
        id=sid, pool="p", app="a", node="n1", status=S.DEAD, epoch=1, owner="n1", last_log=log
    )


def streak(count: int, until: float = 0.0) -> Pool:
    return pool(1, cooldown_until=until).model_copy(update={"crash_count": count})


@pytest.mark.parametrize(
    ("before", "sandboxes", "expected"),
    [
        pytest.param(streak(0), [], None, id="nothing crashed, no streak: nothing to write"),
        pytest.param(
            streak(0),
            [crashed_sb("s1", "x" * 5000)],
            (1, 101.0, "x" * 4000),
            id="a first crash starts a 1 s cooldown and keeps the log's last 4000 characters",
        ),
        pytest.param(
            streak(2, until=50.0),
            [crashed_sb("s1", "first"), crashed_sb("s2", "second")],
            (4, 108.0, "second"),
            id="two more crashes add two to the streak and keep the last one's log",
        ),
        pytest.param(
            streak(3, until=150.0),
            [sb("s1", S.RUNNING)],
            (0, 0.0, ""),
            id="a routable sandbox ends a streak and its cooldown",
        ),
        pytest.param(
            streak(3, until=150.0),
            [sb("s1", S.BOOTING)],
            None,
            id="a booting sandbox does not end a streak",
        ),
        pytest.param(
            streak(0),
            [sb("s1", S.RUNNING)],
            None,
            id="a routable sandbox and no streak: nothing to write",
        ),
        pytest.param(
            streak(0),
            [
                Sandbox(id="s1", pool="p", app="a", node="n1", status=S.DEAD, epoch=2),
            ],
            None,
            id="declared dead by the controller (ownership released) is no crash",
        ),
    ],
)
def test_tally_crashes(
    before: Pool, sandboxes: list[Sandbox], expected: tuple[int, float, str] | None
) -> None:
    after = tally_crashes(before, sandboxes, now=100.0)
    if expected is None:
        assert after is None
    else:
        assert after is not None
        assert (after.crash_count, after.crash_cooldown_until, after.last_crash_log) == expected


@pytest.mark.parametrize(
    ("sandboxes", "expected"),
    [
        pytest.param(
            [sb("old", S.RUNNING, gen=1), crashed_sb("new", "boom")],
            (4, 108.0, "boom"),
            id="one still serving with the values a change replaced does not end the streak",
        ),
        pytest.param(
            [sb("new", S.RUNNING, gen=2)],
            (0, 0.0, ""),
            id="one serving with the current values ends it",
        ),
    ],
)
def test_tally_crashes_after_a_secrets_change(
    sandboxes: list[Sandbox], expected: tuple[int, float, str]
) -> None:
    """The app's restart generation is 2: its replacements crash with the new values while
    the old sandbox serves on; they back off as a crashing deploy's do."""
    after = tally_crashes(streak(3, until=150.0), sandboxes, now=100.0, restart_generation=2)
    assert after is not None
    assert (after.crash_count, after.crash_cooldown_until, after.last_crash_log) == expected


@pytest.mark.parametrize(
    ("gone_since", "holders", "live", "expected_since", "expected_lost"),
    [
        pytest.param({}, {"n1"}, {"n1"}, {}, set(), id="a live holder is not gone"),
        pytest.param(
            {}, {"n1"}, set(), {"n1": 100.0}, set(), id="a holder first seen gone starts now"
        ),
        pytest.param(
            {"n1": 50.0}, {"n1"}, set(), {"n1": 50.0}, set(), id="gone 50 s of 60: kept waiting"
        ),
        pytest.param({"n1": 40.0}, {"n1"}, set(), {"n1": 40.0}, {"n1"}, id="gone 60 s of 60: lost"),
        pytest.param({"n1": 0.0}, {"n1"}, {"n1"}, {}, set(), id="a holder back again is forgotten"),
        pytest.param(
            {"n1": 0.0}, set(), set(), {}, set(), id="a node that holds no state any more"
        ),
    ],
)
def test_lost_holders(
    gone_since: dict[str, float],
    holders: set[str],
    live: set[str],
    expected_since: dict[str, float],
    expected_lost: set[str],
) -> None:
    since, lost = lost_holders(gone_since, holders, live, now=100.0, after=60.0)
    assert (since, lost) == (expected_since, expected_lost)


@pytest.mark.parametrize(
    ("cordon", "cordoned", "evacuating"),
    [
        pytest.param(None, False, False, id="no cordon: as registered"),
        pytest.param(Cordon(node="n1", evacuate=False), True, False, id="cordoned only"),
        pytest.param(Cordon(node="n1", evacuate=True), True, True, id="cordoned, evacuating"),
    ],
)
def test_with_cordon(cordon: Cordon | None, cordoned: bool, evacuating: bool) -> None:
    node = with_cordon(Node(name="n1", address="a"), cordon)
    assert (node.cordoned, node.evacuating) == (cordoned, evacuating)


# -- a secrets change that restarts (the app's restart_generation is 1 below) ------------------

CORDONED = [
    Node(name="n1", address="a", cordoned=True),
    Node(name="n2", address="b", cordoned=True),
]


@pytest.mark.parametrize(
    ("the_pool", "sandboxes", "leased", "nodes", "expected"),
    [
        pytest.param(
            pool(1),
            [sb("a", S.RUNNING)],
            {},
            NODES,
            [Create("n1")],
            id="behind running: a replacement is created first, the old one keeps serving",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.RUNNING), sb("b", S.BOOTING, gen=1)],
            {"a": 2},
            NODES,
            [],
            id="behind running, its replacement booting: nothing drained yet",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.RUNNING), sb("b", S.RUNNING, gen=1)],
            {"a": 2},
            NODES,
            [Drain("a")],
            id="behind running, its replacement routable: drained, its leases finish",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.PENDING)],
            {},
            NODES,
            [Stop("a"), Create("n1")],
            id="behind pending: stopped, and the size rule replaces it",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.BOOTING)],
            {},
            NODES,
            [Stop("a"), Create("n1")],
            id="behind booting: stopped, and the size rule replaces it",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.SUSPENDED, frozen=5)],
            {},
            NODES,
            [Stop("a"), Create("n1")],
            id="behind suspended with no lease: stopped without a drain, and replaced",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.SUSPENDED, frozen=5), sb("b", S.RUNNING, gen=1)],
            {"a": 1},
            NODES,
            [Drain("a")],
            id="behind suspended holding a lease (a takeover): drained once a fresh one serves",
        ),
        pytest.param(
            pool(2),
            [sb("a", S.RUNNING, gen=1), sb("b", S.SUSPENDED, gen=1)],
            {},
            NODES,
            [],
            id="up to date: nothing",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.RUNNING, gen=2)],
            {},
            NODES,
            [],
            id="ahead of the view (created by a newer leader's view): nothing",
        ),
        pytest.param(
            pool(2),
            [sb("a", S.RUNNING), sb("b", S.PENDING)],
            {},
            CORDONED,
            [],
            id="no node takes a replacement: nothing drained or stopped, the pool never doubles",
        ),
        pytest.param(
            pool(2, cooldown_until=150),
            [sb("a", S.RUNNING), sb("b", S.PENDING)],
            {},
            NODES,
            [],
            id="a crash cooldown (crashing with the new values?): the old ones stay and serve",
        ),
        pytest.param(
            pool(3, retired=True),
            [sb("a", S.RUNNING), sb("b", S.DRAINING)],
            {"b": 1},
            NODES,
            [Drain("a")],
            id="a retired pool is left to its own scale-down: nothing created",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.DRAINING), sb("b", S.RUNNING, gen=1)],
            {"a": 1},
            NODES,
            [],
            id="a behind sandbox already draining finishes its leases",
        ),
        pytest.param(
            pool(3),
            [
                *(sb(f"old{i}", S.RUNNING) for i in range(3)),
                sb("new0", S.RUNNING, gen=1, node="n2"),
                sb("new1", S.RUNNING, gen=1, node="n2"),
                sb("new2", S.BOOTING, gen=1, node="n2"),
            ],
            {},
            NODES,
            [],
            id="two of three fresh ones routable: none of the three behind is drained yet",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.RUNNING), sb("b", S.RUNNING, activity=5), sb("c", S.RUNNING, gen=1)],
            {"b": 1},
            NODES,
            [Drain("a"), Drain("b")],
            id="behind ones past the pool's size: all drained once the size is served",
        ),
        pytest.param(
            pool(1),
            [sb("a", S.RUNNING, node="n1")],
            {},
            EVACUATING,
            [Create("n2")],
            id="behind and on an evacuating node: one replacement, not two",
        ),
        pytest.param(
            stateful_pool(),
            [sb("a", S.RUNNING)],
            {"a": 1},
            NODES,
            [Drain("a")],
            id="stateful behind: moved (gated at once, no second writer created)",
        ),
        pytest.param(
            stateful_pool(),
            [sb("a", S.BOOTING)],
            {},
            NODES,
            [Stop("a")],
            id="stateful behind, booting: stopped, created anew once its state is free",
        ),
        pytest.param(
            stateful_pool(),
            [sb("a", S.RUNNING)],
            {},
            CORDONED,
            [],
            id="stateful behind with no node to move to: stays and serves",
        ),
    ],
)
def test_a_secrets_restart(
    the_pool: Pool,
    sandboxes: list[Sandbox],
    leased: dict[str, int],
    nodes: list[Node],
    expected: list[Action],
) -> None:
    held = app_state("n1") if the_pool.spec.state is not None else None
    plan = plan_pool(
        the_pool, sandboxes, leased, nodes, {}, 100.0, state=held, restart_generation=1
    )
    assert plan == expected


@pytest.mark.parametrize(
    ("generation", "restart_generation", "expected"),
    [
        pytest.param(0, 0, False, id="no secrets change that restarts"),
        pytest.param(0, 1, True, id="created before the first change"),
        pytest.param(2, 3, True, id="created before the latest change"),
        pytest.param(3, 3, False, id="created at the latest change"),
        pytest.param(4, 3, False, id="created from a newer view: not behind"),
    ],
)
def test_behind(generation: int, restart_generation: int, expected: bool) -> None:
    assert behind(sb("a", S.RUNNING, gen=generation), restart_generation) is expected


def test_a_pool_of_three_behind_is_replaced_without_ever_serving_fewer_than_three() -> None:
    """Tick by tick with a node that starts what is placed in two ticks and a lease that ends
    one tick after its drain: the planner alone keeps three routable throughout."""
    sandboxes = {f"old{i}": sb(f"old{i}", S.RUNNING) for i in range(3)}
    made = 0
    routable_counts = []
    for _ in range(12):
        leased = {i: 1 for i, s in sandboxes.items() if s.status is S.RUNNING}
        for action in plan_pool(
            pool(3), list(sandboxes.values()), leased, NODES, {}, 0.0, restart_generation=1
        ):
            if isinstance(action, Create):
                made += 1
                sandboxes[f"new{made}"] = sb(f"new{made}", S.PENDING, node=action.node, gen=1)
            else:
                assert isinstance(action, Drain | Stop)
                new = S.DRAINING if isinstance(action, Drain) else S.STOPPED
                sandboxes[action.sandbox_id] = sandboxes[action.sandbox_id].model_copy(
                    update={"status": new, "ready": False}
                )
            routable_counts.append(sum(s.routable for s in sandboxes.values()))
        for sid, sandbox in list(sandboxes.items()):  # the node's turn
            step = {S.PENDING: S.BOOTING, S.BOOTING: S.RUNNING}.get(sandbox.status)
            if sandbox.status is S.STOPPED:
                del sandboxes[sid]
            elif step is not None:
                sandboxes[sid] = sb(sid, step, node=sandbox.node, gen=1)
        routable_counts.append(sum(s.routable for s in sandboxes.values()))
    assert sorted(sandboxes) == ["new1", "new2", "new3"]
    assert all(s.status is S.RUNNING for s in sandboxes.values())
    assert min(routable_counts) == 3
