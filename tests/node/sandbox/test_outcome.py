"""How a sandbox's end is recorded (`wakeful/node/sandbox/outcome.py`), as tables: the event
and the `last_log` a person reads."""

from __future__ import annotations

import pytest

from wakeful.domain.lifecycle import Transition
from wakeful.node.sandbox.outcome import ending, last_lines


@pytest.mark.parametrize(
    ("tail", "reason", "expected"),
    [
        pytest.param("boom\n", None, "boom\n", id="no reason: the last lines alone"),
        pytest.param(
            "boom", "out of memory", "out of memory\nboom", id="a reason: before the lines"
        ),
        pytest.param("", "out of memory", "out of memory", id="a reason and no output"),
        pytest.param("", None, "", id="nothing at all"),
    ],
)
def test_last_lines(tail: str, reason: str | None, expected: str) -> None:
    assert last_lines(tail, reason) == expected


@pytest.mark.parametrize(
    ("stopping", "ready", "squatted", "tail", "expected"),
    [
        pytest.param(
            True,
            True,
            False,
            "bye",
            (Transition.STOPPED, "bye"),
            id="asked to stop: stopped, with its last lines",
        ),
        pytest.param(
            True,
            False,
            True,
            "",
            (Transition.STOPPED, ""),
            id="asked to stop before it was ready: stopped all the same",
        ),
        pytest.param(
            False,
            True,
            False,
            "Traceback",
            (Transition.FAIL, "Traceback"),
            id="exited while ready: dead, with its last lines",
        ),
        pytest.param(
            False,
            False,
            False,
            "",
            (Transition.FAIL, "not ready within 5 s"),
            id="never ready and silent: dead, not ready within its health timeout",
        ),
        pytest.param(
            False,
            False,
            False,
            "cannot bind",
            (Transition.FAIL, "cannot bind"),
            id="never ready but said why: dead, with what it said",
        ),
        pytest.param(
            False,
            False,
            True,
            "listening",
            (Transition.FAIL, "port 8001 answered, but not from this sandbox\nlistening"),
            id="another process answered on its port: dead, saying so first",
        ),
    ],
)
def test_ending(
    stopping: bool, ready: bool, squatted: bool, tail: str, expected: tuple[Transition, str]
) -> None:
    got = ending(
        stopping=stopping, ready=ready, squatted=squatted, tail=tail, timeout=5.0, port=8001
    )
    assert got == expected


@pytest.mark.parametrize(
    ("gave_up", "exit_code", "tail", "expected"),
    [
        pytest.param(
            True,
            143,
            "image app on 8080",
            "not ready on port 8001 within 5 s\nimage app on 8080",
            id="still running at the health timeout: that first, whatever it said",
        ),
        pytest.param(
            True,
            143,
            "",
            "not ready on port 8001 within 5 s",
            id="still running at the health timeout, silent",
        ),
        pytest.param(False, 4, "", "exited with 4 before it was ready", id="ended at once, silent"),
        pytest.param(
            False, 3, "boom: missing config", "boom: missing config", id="ended saying why"
        ),
    ],
)
def test_ending_before_ready_says_which_way(
    gave_up: bool, exit_code: int, tail: str, expected: str
) -> None:
    """A crash is the app's own exit; a sandbox its node stopped waiting for did not crash (a
    wrong `port` looks like this), and its last log says so first."""
    got = ending(
        stopping=False,
        ready=False,
        squatted=False,
        tail=tail,
        timeout=5.0,
        port=8001,
        gave_up=gave_up,
        exit_code=exit_code,
    )
    assert got == (Transition.FAIL, expected)
