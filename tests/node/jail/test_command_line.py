"""What `ps` shows of a sandbox: short command lines, never a program's source.

bwrap keeps its argv for the sandbox's whole life, and so does the init it forks in the
sandbox's PID namespace: whatever the chain hands bwrap stays in `/proc/<pid>/cmdline` of both.
The slot program (an idle warm slot's, and the Landlock scope step of a cold start) is run by
path from a read-only bind, so none of its source is in there."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from wakeful.node.jail.detect import detect_jail
from wakeful.node.jail.jailed import descendants
from wakeful.node.jail.uids import UidTable
from wakeful.node.sandbox.local import ProcessRuntime
from wakeful.node.sandbox.runtime import Identity
from wakeful.node.secrets import BASE_ENV

pytestmark = pytest.mark.anyio
BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs Debian's bubblewrap")
SLOTS = pytest.mark.skipif(os.geteuid() != 0, reason="warm slots need root (cgroups)")


def argv_of(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return raw.decode(errors="replace").split("\0")[:-1]


def command_lines(pid: int) -> dict[int, list[str]]:
    """The argv of `pid` and of every process under it that is still there."""
    found = {}
    for each in (pid, *descendants(pid)):
        try:
            found[each] = argv_of(each)
        except OSError:
            continue  # ended meanwhile
    return found


def assert_short(lines: dict[int, list[str]]) -> None:
    """No argument is a program: every one is a single line, and none is long."""
    assert lines
    for pid, argv in lines.items():
        long = [arg[:60] for arg in argv if "\n" in arg or len(arg) > 512]
        assert not long, f"pid {pid} ({argv[0]}) holds a program in its command line: {long}"


def runtime(data_dir: Path, isolated: bool, warm_slots: int) -> ProcessRuntime:
    if not isolated:
        return ProcessRuntime()
    data_dir.mkdir(exist_ok=True)
    jail = detect_jail(data_dir)
    uids = UidTable(data_dir / "uids.json", claims=data_dir / "claims")
    homes = data_dir / "sandboxes"
    return ProcessRuntime(jail=jail, uids=uids, warm_slots=warm_slots, slot_homes=homes)


@contextlib.asynccontextmanager
async def filled(started: ProcessRuntime) -> AsyncIterator[ProcessRuntime]:
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(started.keep_warm)
        if started.slots is not None:
            with anyio.fail_after(30):
                await started.slots.filled()
        yield started
        tasks.cancel_scope.cancel()


@BWRAP
@SLOTS
async def test_an_idle_warm_slot_holds_no_program_source(tmp_path: Path) -> None:
    """Its three processes (bwrap, the namespace's init, the slot program waiting for its start
    message) each once held the whole of `slot_main.py`."""
    started = runtime(tmp_path, isolated=True, warm_slots=1)
    if started.slots is None:
        pytest.skip("no warm slots on this machine (no Python visible in a sandbox)")
    async with filled(started) as ready:
        assert ready.slots is not None
        (slot,) = ready.slots.idle
        lines = command_lines(slot.process.pid)
        assert len(lines) == 3, lines
        assert_short(lines)


@pytest.mark.parametrize(
    ("isolated", "warm_slots"),
    [
        pytest.param(False, 0, id="unisolated"),
        pytest.param(True, 0, id="isolated, the whole chain", marks=BWRAP),
        pytest.param(True, 1, id="isolated, from a warm slot", marks=[BWRAP, SLOTS]),
    ],
)
async def test_a_running_sandbox_shows_short_command_lines(
    tmp_path: Path, isolated: bool, warm_slots: int
) -> None:
    workdir = tmp_path / "sandboxes" / "sb" / "app"
    workdir.mkdir(parents=True)
    async with filled(runtime(tmp_path, isolated, warm_slots)) as ready:
        process = await ready.start(
            ["sleep", "60"],
            BASE_ENV,
            workdir,
            workdir.parent / "output.log",
            Identity("sb", "a"),
        )
        try:
            with anyio.fail_after(30):  # until the chain has exec'd down to the app
                while True:
                    if any(argv[:1] == ["sleep"] for argv in command_lines(process.pid).values()):
                        break
                    await anyio.sleep(0.01)
            assert_short(command_lines(process.pid))
            if warm_slots and ready.slots is not None:
                assert ready.slots.taken == 1  # the path under test was the one taken
        finally:
            await process.stop(grace=5)
