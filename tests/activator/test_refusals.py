"""Table tests of why a request gets no lease (`activator/refusals.py`): a crash cooldown, a
stateful app's kept state, and which wait a timed-out request is told about."""

from __future__ import annotations

import pytest

from wakeful.activator.refusals import crashing, state_kept, timed_out
from wakeful.domain.leases import ActivatorError, AppFailedToBoot, NoCapacity
from wakeful.domain.models import AppSpec, AppState, Concurrency, Pool, StateSpec

NOW = 1_000.0
SPEC = AppSpec(command=["serve"], activation_timeout=120)


def pool(**changes: object) -> Pool:
    return Pool(name="hello-v1", app="hello", version="v1", spec=SPEC).model_copy(update=changes)


def facts(exc: ActivatorError | None) -> tuple[type[ActivatorError], str, int, str] | None:
    if exc is None:
        return None
    return type(exc), str(exc), getattr(exc, "retry_after", 0), getattr(exc, "log", "")


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        pytest.param(pool(), None, id="no cooldown: it may start"),
        pytest.param(
            pool(crash_cooldown_until=NOW, crash_count=3), None, id="a cooldown that just ended"
        ),
        pytest.param(
            pool(crash_cooldown_until=NOW + 29.6, crash_count=3, last_crash_log="boom"),
            AppFailedToBoot("app 'hello' failed to boot (3 crashes in a row)", 30, "boom"),
            id="in a cooldown: answered at once with its boot log, until the cooldown ends",
        ),
    ],
)
def test_crashing(found: Pool, expected: AppFailedToBoot | None) -> None:
    assert facts(crashing(found, NOW)) == facts(expected)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(None, None, id="no state record yet"),
        pytest.param(AppState(app="hello", node="n1"), None, id="a state held, not kept"),
        pytest.param(
            AppState(app="hello", node="n1", kept=True),
            NoCapacity(
                "app 'hello' keeps state that node n1 could not hand back: it starts again "
                "once an operator frees it (`wakeful nodes` says why; `wakeful release-state "
                "hello`)",
                60,
            ),
            id="kept by a node: answered at once, naming the node and the command",
        ),
    ],
)
def test_state_kept(state: AppState | None, expected: NoCapacity | None) -> None:
    assert facts(state_kept("hello", state)) == facts(expected)


@pytest.mark.parametrize(
    ("spec", "routable", "expected"),
    [
        pytest.param(
            SPEC,
            False,
            "no sandbox of app 'hello' became ready within 120 s",
            id="nothing became ready",
        ),
        pytest.param(
            SPEC.model_copy(update={"concurrency": Concurrency(hard_limit=12)}),
            True,
            "every sandbox of app 'hello' stayed at its hard limit of 12 requests for 120 s",
            id="some routable: each stayed at its hard limit",
        ),
        pytest.param(
            SPEC.model_copy(update={"state": StateSpec(path="data")}),
            False,
            "app 'hello' keeps state and was not ready within 120 s: its sandbox is moving to "
            "another node or waits for its state to be handed back (`wakeful nodes` shows "
            "moves in progress)",
            id="a stateful app's one sandbox is moving",
        ),
    ],
)
def test_timed_out(spec: AppSpec, routable: bool, expected: str) -> None:
    assert facts(timed_out("hello", spec, routable=routable)) == facts(NoCapacity(expected, 5))
