"""Ownership fencing (invariant 15) as a table: may node n1 apply a lifecycle event to a
sandbox record, and with what owner and epoch?"""

from __future__ import annotations

import pytest

from wakeful.domain.lifecycle import Transition as T
from wakeful.domain.models import Sandbox
from wakeful.domain.models import SandboxStatus as S
from wakeful.node.fencing import Refusal, Refuse, Write, decide, start_epoch

ME = "n1"


def record(
    status: S = S.RUNNING, owner: str | None = ME, epoch: int = 1, node: str = ME
) -> Sandbox:
    return Sandbox(
        id="sb-1", pool="web-v1", app="web", node=node, status=status, owner=owner, epoch=epoch
    )


@pytest.mark.parametrize(
    ("sandbox", "started_at", "event", "expected"),
    [
        pytest.param(
            record(S.BOOTING),
            1,
            T.READY,
            Write(S.RUNNING, owner=ME, epoch=1),
            id="ours at the epoch we started it at: written, ownership unchanged",
        ),
        pytest.param(
            record(S.DRAINING, epoch=4),
            4,
            T.STOP,
            Write(S.STOPPING, owner=ME, epoch=4),
            id="ours at a later epoch we started it at: written at that epoch",
        ),
        pytest.param(
            record(S.PENDING, owner=None, epoch=0),
            1,
            T.START,
            Write(S.BOOTING, owner=ME, epoch=1, adopted=True),
            id="unowned record placed here is adopted at epoch 1",
        ),
        pytest.param(
            record(S.RUNNING, owner=None, epoch=0),
            None,
            T.FAIL,
            Write(S.DEAD, owner=ME, epoch=1, adopted=True),
            id="unowned record placed here is adopted by burying what a previous run left",
        ),
        pytest.param(
            record(S.RUNNING, epoch=3),
            None,
            T.FAIL,
            Write(S.DEAD, owner=ME, epoch=3),
            id="ours, left by a previous run: buried at the epoch it reads",
        ),
        pytest.param(
            record(S.RUNNING, owner=None, epoch=2),
            1,
            T.FAIL,
            Refusal.NOT_OURS,
            id="released at a new epoch: the old owner's write is refused",
        ),
        pytest.param(
            record(S.RUNNING, owner=None, epoch=2),
            None,
            T.FAIL,
            Refusal.NOT_OURS,
            id="released at a new epoch: never adopted, not even by a later run",
        ),
        pytest.param(
            record(S.RUNNING, owner="n2", epoch=2, node="n2"),
            1,
            T.FAIL,
            Refusal.NOT_OURS,
            id="moved to another node: the old owner's write is refused",
        ),
        pytest.param(
            record(S.PENDING, owner="n2", epoch=1),
            1,
            T.START,
            Refusal.NOT_OURS,
            id="placed here but owned by another node: refused",
        ),
        pytest.param(
            record(S.PENDING, owner=None, epoch=0, node="n2"),
            None,
            T.START,
            Refusal.NOT_OURS,
            id="unowned but placed on another node: not adopted",
        ),
        pytest.param(
            record(S.RUNNING, epoch=3),
            1,
            T.FAIL,
            Refusal.STALE_EPOCH,
            id="ours again at a later epoch: the run started at the old one is refused",
        ),
        pytest.param(
            record(S.DEAD),
            1,
            T.READY,
            Refusal.ILLEGAL,
            id="ours, but the lifecycle table has no such move: refused, nothing changes",
        ),
        pytest.param(
            record(S.PENDING, owner=None, epoch=0),
            1,
            T.READY,
            Refusal.ILLEGAL,
            id="unowned and an illegal move: not adopted either",
        ),
    ],
)
def test_fencing(
    sandbox: Sandbox, started_at: int | None, event: T, expected: Write | Refusal
) -> None:
    decision = decide(sandbox, ME, started_at, event)
    if isinstance(expected, Write):
        assert decision == expected
    else:
        assert isinstance(decision, Refuse) and decision.why is expected


@pytest.mark.parametrize(
    ("sandbox", "expected"),
    [
        pytest.param(record(S.PENDING), 1, id="placed here at epoch 1: run at 1"),
        pytest.param(record(S.PENDING, epoch=3), 3, id="ours at epoch 3: run at 3"),
        pytest.param(record(S.PENDING, owner=None, epoch=0), 1, id="unowned: run at 1, adopted"),
        pytest.param(record(S.PENDING, owner=None, epoch=2), None, id="released: not ours to run"),
        pytest.param(record(S.PENDING, owner="n2"), None, id="another node's: not ours to run"),
    ],
)
def test_start_epoch(sandbox: Sandbox, expected: int | None) -> None:
    assert start_epoch(sandbox, ME) == expected


def test_a_write_carries_status_ownership_and_fields_and_only_running_is_ready() -> None:
    booting = record(S.BOOTING, owner=None, epoch=0)
    adopt = Write(S.RUNNING, owner=ME, epoch=1, adopted=True)
    running = adopt.applied_to(booting, {"address": "127.0.0.1:20001", "ready": True})
    assert (running.status, running.owner, running.epoch) == (S.RUNNING, ME, 1)
    assert running.ready and running.address == "127.0.0.1:20001"
    drained = Write(S.DRAINING, owner=ME, epoch=1).applied_to(running, {})
    assert not drained.ready and drained.address == "127.0.0.1:20001"
