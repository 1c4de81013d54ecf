"""One exchange's stage (`upstream.exchange`): the table is the spec, an illegal move raises
and changes nothing, and only a clean whole answer leaves the connection reusable."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from wakeful.ingress.errors import UpstreamFailed, UpstreamTimeout
from wakeful.ingress.upstream import exchange
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
        with pytest.raises(
            IllegalMove, match=f"^an exchange cannot move from {start.name} to {to.name}$"
        ):
            state.move(to)
        assert state.stage is start


def _stage_of(test: ast.expr, op: type[ast.cmpop]) -> Stage | None:
    """FROM when `test` is `<...>.stage <op> FROM` (or `stage <op> FROM`), or an `and`
    holding one; else None."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        found = [_stage_of(each, op) for each in test.values]
        return next((stage for stage in found if stage is not None), None)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, right = test.left, test.comparators[0]
    names_stage = (isinstance(left, ast.Attribute) and left.attr == "stage") or (
        isinstance(left, ast.Name) and left.id == "stage"
    )
    if names_stage and isinstance(test.ops[0], op) and isinstance(right, ast.Name):
        return Stage[right.id]
    return None


def _moves(body: list[ast.stmt], known: Stage | None, found: list[str], where: str) -> None:
    """Walk `body` knowing the stage is `known` (None: not known), checking each inline
    `<...>.stage = TO` against the table."""
    for node in body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "stage" for t in node.targets
        ):
            assert isinstance(node.value, ast.Name), f"{where}:{node.lineno} sets a stage"
            to = Stage[node.value.id]
            assert known is not None, f"{where}:{node.lineno}: no guard names the stage left"
            assert (known, to) in LEGAL, f"{where}:{node.lineno}: {known.name} to {to.name}"
            found.append(f"{known.name} to {to.name}")
            known = to
        elif isinstance(node, ast.If):
            leaving = _stage_of(node.test, ast.IsNot)
            if leaving is not None and isinstance(node.body[-1], ast.Raise):
                known = leaving  # `if stage is not FROM: raise`: from here on, FROM
                continue
            _moves(node.body, _stage_of(node.test, ast.Is) or known, found, where)
            _moves(node.orelse, known, found, where)
            if any(
                _flows_on(branch) and _sets_stage_in(branch) for branch in (node.body, node.orelse)
            ):
                known = None
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if inner and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    _moves([n for n in inner if isinstance(n, ast.stmt)], known, found, where)
            if _sets_stage(node):
                known = None


def _flows_on(branch: list[ast.stmt]) -> bool:
    """Control can leave `branch` at its end (it does not end in a return or a raise)."""
    return not branch or not isinstance(branch[-1], ast.Return | ast.Raise)


def _sets_stage_in(branch: list[ast.stmt]) -> bool:
    return any(_sets_stage(each) for each in branch)


def _sets_stage(node: ast.AST) -> bool:
    return any(
        isinstance(each, ast.Assign)
        and any(isinstance(t, ast.Attribute) and t.attr == "stage" for t in each.targets)
        for each in ast.walk(node)
    )


def test_every_inline_move_of_the_protocols_is_a_move_of_the_table() -> None:
    """Outside `exchange.py`, a stage is set inline only under a guard naming the stage it
    leaves, and that move is in the table: checked here, once, instead of per request."""
    package = Path(exchange.__file__).parent
    found: list[str] = []
    for module in sorted(package.glob("*.py")):
        if module.name == "exchange.py":
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                _moves(node.body, None, found, f"{module.name}:{node.name}")
    assert sorted(found) == [
        "BODY to COMPLETE",
        "COMPLETE to IDLE",
        "HEAD to BODY",
        "HEAD to INTERIM",
        "IDLE to SENT",
        "INTERIM to HEAD",
        "SENT to HEAD",
    ]


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
