"""`spawn` and `run_tool`: children started through `Popen`'s vfork, never a fork of the piece.

A fork of a piece on uvloop (`anyio.run_process`, `open_process`, asyncio's subprocess
functions all go through libuv's `uv_spawn` there) runs grpc's fork handlers; beside etcd calls
in flight the child sometimes died of SIGSEGV before its exec (umoci, 1 start in 400 here), and
a deploy's image then "failed to boot". The last test keeps every such call out of the code."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import anyio
import pytest

from wakeful.aio.spawn import TAIL_BYTES, run_tool

pytestmark = pytest.mark.anyio

WAKEFUL = Path(__file__).resolve().parents[2] / "wakeful"
FORKING = {
    ("anyio", "run_process"),
    ("anyio", "open_process"),
    ("asyncio", "create_subprocess_exec"),
    ("asyncio", "create_subprocess_shell"),
}
"""Calls that fork the whole process on uvloop."""
FORKING_METHODS = {"subprocess_exec", "subprocess_shell"}
"""An event loop's own methods that do."""


async def test_a_tool_gives_its_exit_status_and_its_last_line() -> None:
    done = await run_tool([sys.executable, "-c", "print('first'); print('last'); exit(3)"])
    assert done.returncode == 3
    assert done.last_line() == "last"


async def test_a_tool_that_says_nothing_is_named_by_its_status_and_a_signal_by_its_number() -> None:
    done = await run_tool([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert done.returncode == -9
    assert done.last_line() == "-9"


async def test_only_the_tail_of_a_long_output_is_kept() -> None:
    script = "import sys; sys.stdout.write('x' * 1_000_000 + '\\nthe end\\n')"
    done = await run_tool([sys.executable, "-c", script])
    assert done.returncode == 0
    assert len(done.said) == TAIL_BYTES
    assert done.last_line() == "the end"


async def test_a_cancelled_run_kills_and_reaps_its_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    with anyio.move_on_after(5) as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(run_tool, [sys.executable, "-c", script])
            while not pid_file.exists() or not pid_file.read_text():  # noqa: ASYNC110 -- a file
                await anyio.sleep(0.01)
            group.cancel_scope.cancel()
    assert not scope.cancelled_caught  # cancelled at once, not after the sleep
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # gone, and reaped: no zombie keeps the pid
        os.kill(pid, 0)


def forking_calls(tree: ast.AST) -> list[int]:
    """The lines of `tree` that start a child through a fork of the process on uvloop."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        name = node.func.attr
        named = isinstance(owner, ast.Name) and (owner.id, name) in FORKING
        if named or name in FORKING_METHODS:
            found.append(node.lineno)
    return found


def test_the_scan_finds_each_forking_call() -> None:
    code = (
        "await anyio.run_process(['true'])\n"
        "await anyio.open_process(['true'])\n"
        "await asyncio.create_subprocess_exec('true')\n"
        "await loop.subprocess_exec(factory, 'true')\n"
        "subprocess.run(['true'])\n"  # vfork: fine
    )
    assert forking_calls(ast.parse(code)) == [1, 2, 3, 4]


def test_no_piece_starts_a_child_through_a_fork_of_itself() -> None:
    found = {
        f"{path.relative_to(WAKEFUL.parent)}:{line}"
        for path in WAKEFUL.rglob("*.py")
        for line in forking_calls(ast.parse(path.read_text(), str(path)))
    }
    assert not found, f"start these through wakeful.aio.spawn instead: {sorted(found)}"
