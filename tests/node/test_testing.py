"""The shipped test helpers (`wakeful.node.testing`) tell an idle warm slot from a sandbox by
its command line alone."""

from __future__ import annotations

import pytest

from wakeful.node.jail.bwrap import SLOT_MARK, SLOT_PROGRAM
from wakeful.node.jail.slot_main import SCOPE_MARK
from wakeful.node.testing import idle_slot

SLOT = ["/usr/bin/python3", "-I", "-S", SLOT_PROGRAM, SLOT_MARK, "5"]


@pytest.mark.parametrize(
    ("argv", "idle"),
    [
        pytest.param(SLOT, True, id="the slot program waiting for its start message is idle"),
        pytest.param(
            ["/usr/bin/bwrap", "--unshare-pid", "--ro-bind", "/d/slot", "/.wakeful", "--", *SLOT],
            False,
            id="bwrap, whose command line ends with the slot's, is not",
        ),
        pytest.param(
            ["/usr/bin/python3", "-I", "-S", SLOT_PROGRAM, SCOPE_MARK, "sleep", "60"],
            False,
            id="the scope step of a cold start is not",
        ),
        pytest.param(["sleep", "60"], False, id="the app a slot became is not"),
        pytest.param(
            ["python3", "-c", f"print({SLOT_MARK!r})"], False, id="an app naming the mark is not"
        ),
        pytest.param([], False, id="a process with no command line is not"),
    ],
)
def test_idle_slot(argv: list[str], idle: bool) -> None:
    assert idle_slot(argv) is idle
