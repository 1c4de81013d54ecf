from __future__ import annotations

import pytest

from wakeful.domain.lifecycle import TABLE, IllegalTransition, Transition, transition
from wakeful.domain.models import SandboxStatus as S


@pytest.mark.parametrize(
    ("status", "event", "expected"),
    [
        pytest.param(S.PENDING, Transition.START, S.BOOTING, id="a started sandbox boots"),
        pytest.param(S.BOOTING, Transition.READY, S.RUNNING, id="a ready one runs"),
        pytest.param(S.RUNNING, Transition.DRAIN, S.DRAINING, id="scale-down drains first"),
        pytest.param(S.DRAINING, Transition.STOP, S.STOPPING, id="a drained one stops"),
        pytest.param(S.STOPPING, Transition.STOPPED, S.STOPPED, id="and is stopped"),
        pytest.param(S.BOOTING, Transition.FAIL, S.DEAD, id="a failed boot is dead"),
        pytest.param(S.RUNNING, Transition.FAIL, S.DEAD, id="an exit while running is dead"),
        pytest.param(S.RUNNING, Transition.SUSPEND, S.SUSPENDED, id="an idle one is frozen"),
        pytest.param(S.SUSPENDED, Transition.THAW, S.RUNNING, id="and thawed runs again"),
        pytest.param(S.SUSPENDED, Transition.STOP, S.STOPPING, id="a frozen one may stop"),
        pytest.param(S.SUSPENDED, Transition.DRAIN, S.DRAINING, id="or leave admission"),
        pytest.param(S.SUSPENDED, Transition.FAIL, S.DEAD, id="or die frozen"),
    ],
)
def test_legal_transitions(status: S, event: Transition, expected: S) -> None:
    assert transition(status, event) is expected


@pytest.mark.parametrize(
    ("status", "event"),
    [
        pytest.param(S.PENDING, Transition.READY, id="ready before booting"),
        pytest.param(S.DRAINING, Transition.READY, id="a draining sandbox cannot re-enter"),
        pytest.param(S.STOPPED, Transition.START, id="a stopped sandbox never restarts"),
        pytest.param(S.DEAD, Transition.READY, id="the dead stay dead"),
        pytest.param(S.STOPPING, Transition.DRAIN, id="no drain while stopping"),
        pytest.param(S.BOOTING, Transition.SUSPEND, id="only a running sandbox is frozen"),
        pytest.param(S.DRAINING, Transition.SUSPEND, id="never one leaving admission"),
        pytest.param(S.RUNNING, Transition.THAW, id="only a frozen one thaws"),
        pytest.param(S.SUSPENDED, Transition.READY, id="a thaw is not a boot"),
    ],
)
def test_illegal_transitions_raise(status: S, event: Transition) -> None:
    with pytest.raises(IllegalTransition, match=status.value):
        transition(status, event)


def test_finished_states_have_no_way_out() -> None:
    assert not [key for key in TABLE if key[0] in (S.STOPPED, S.DEAD)]
