"""One exchange's stage (`upstream.exchange`): the table is the spec, an illegal move raises
and changes nothing, and only a clean whole answer leaves the connection reusable."""

from __future__ import annotations

import itertools

import pytest

from wakeful.ingress.errors import UpstreamFailed, UpstreamTimeout
from wakeful.ingress.upstream.exchange import (
    BODY,
    COMPLETE,
    FAILED,
    HEAD,
    IDLE,
    INTERIM,
    MOVES,
    SENT,
    SWITCHED,
    ExchangeState,
    IllegalMove,
    Stage,
)


def at(stage: Stage) -> ExchangeState:
    state = ExchangeState()
    state.stage = stage
    return state


LEGAL = {
    (IDLE, SENT),
    (SENT, HEAD),
    (SENT, FAILED),
    (HEAD, INTERIM),
    (HEAD, BODY),
    (HEAD, FAILED),
    (INTERIM, HEAD),
    (INTERIM, FAILED),
    (BODY, COMPLETE),
    (BODY, FAILED),
    (COMPLETE, IDLE),
    (COMPLETE, SWITCHED),
}


def test_the_table_is_the_legal_moves() -> None:
    assert {(a, b) for a, moves in MOVES.items() for b in moves} == LEGAL


@pytest.mark.parametrize(
    ("start", "to"),
    list(itertools.product(Stage, Stage)),
    ids=[f"{a.name} to {b.name}" for a, b in itertools.product(Stage, Stage)],
)
def test_every_move(start: Stage, to: Stage) -> None:
    state = at(start)
    if (start, to) in LEGAL:
        state.move(to)
        assert state.stage is to
    else:
        with pytest.raises(IllegalMove):
            state.move(to)
        assert state.stage is start


def test_a_request_begins_only_on_an_idle_connection() -> None:
    state = ExchangeState()
    state.begin(head_only=True, chunked_body=False, body_sent=False)
    assert (state.stage, state.head_only, state.body_sent) == (SENT, True, False)
    with pytest.raises(IllegalMove):
        state.begin(head_only=False, chunked_body=False, body_sent=True)
    assert state.head_only  # unchanged


@pytest.mark.parametrize(
    ("stage", "fails", "answered"),
    [
        pytest.param(SENT, True, False, id="before any byte of the answer: unanswered"),
        pytest.param(HEAD, True, True, id="mid-head: answered"),
        pytest.param(INTERIM, True, True, id="after a 1xx: answered"),
        pytest.param(BODY, True, True, id="mid-body: answered"),
        pytest.param(COMPLETE, False, True, id="a whole answer stands"),
        pytest.param(SWITCHED, False, True, id="a tunnel is not an exchange any more"),
        pytest.param(IDLE, False, False, id="no exchange to fail"),
    ],
)
def test_fail(stage: Stage, fails: bool, answered: bool) -> None:
    state = at(stage)
    error = UpstreamTimeout("silent")
    assert state.fail(error) is fails
    assert state.stage is (FAILED if fails else stage)
    assert state.error is (error if fails else None)
    assert state.answered is answered


def test_the_first_failure_is_kept_and_a_failed_exchange_never_completes() -> None:
    state = at(BODY)
    first = UpstreamTimeout("silent")
    state.fail(first)
    assert not state.fail(UpstreamFailed("closed"))
    assert state.error is first
    with pytest.raises(IllegalMove):
        state.move(COMPLETE)


def _clean() -> ExchangeState:
    state = at(COMPLETE)
    state.keep_alive = True
    return state


@pytest.mark.parametrize(
    ("change", "reusable"),
    [
        pytest.param({}, True, id="a whole answer that keeps the connection alive"),
        pytest.param({"keep_alive": False}, False, id="Connection: close"),
        pytest.param({"stage": BODY}, False, id="an answer not read to its end"),
        pytest.param({"stage": FAILED}, False, id="a failed exchange"),
        pytest.param({"body_sent": False}, False, id="a request body not sent whole"),
        pytest.param({"chunked_body": True}, False, id="a body sent chunked"),
        pytest.param({"head_only": True}, False, id="a HEAD answer"),
        pytest.param({"extra": True}, False, id="a second answer came"),
    ],
)
def test_reusable(change: dict[str, object], reusable: bool) -> None:
    state = _clean()
    for name, value in change.items():
        setattr(state, name, value)
    assert state.reusable is reusable
