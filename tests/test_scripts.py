"""The shell scripts CI runs: none may pipe into a reader that exits early.

Under `set -o pipefail`, `cmd | head -1` fails at random: `head` exits after one line, `cmd`
dies of SIGPIPE writing the rest (exit 141), and pipefail makes that the pipeline's status.
`grep -q` does the same. This failed one CI run in eight before it was caught.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(
    p
    for p in [*ROOT.joinpath("scripts").iterdir(), *ROOT.joinpath(".ci").iterdir()]
    if p.is_file() and p.read_text(errors="replace").startswith("#!")
)
EARLY_EXIT = re.compile(r"\|\s*(head\b|grep\s+(-\w*q|--quiet)|sed\s+-n?\s*['\"]?\d*q)")


def test_there_are_scripts_to_check() -> None:
    assert {p.name for p in SCRIPTS} >= {"test", "up", "run"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_no_pipe_into_a_reader_that_exits_early(script: Path) -> None:
    text = script.read_text()
    assert "set -euo pipefail" in text, f"{script.name} must run under set -euo pipefail"
    bad = [
        f"{script.name}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if not line.lstrip().startswith("#") and EARLY_EXIT.search(line)
    ]
    assert not bad, "pipes into head/grep -q fail at random under pipefail:\n" + "\n".join(bad)
