"""The contract every `Runtime` keeps, run against the real `ProcessRuntime` and the
`FakeRuntime` the package ships (ids `process` and `fake`): start, pump with forward, wait,
stop with a grace, tail.

Each program is written twice, side by side: as a real command, and as the `FakeProgram` that
stands for it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from wakeful.node.sandbox.local import ProcessRuntime
from wakeful.node.sandbox.output import TAIL_LINES
from wakeful.node.sandbox.runtime import Runtime, SandboxProcess
from wakeful.node.testing import FakeProgram, FakeRuntime

pytestmark = pytest.mark.anyio


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


LONG_LINE = "x" * 1500 + " the end"
LINES = [f"line {n}" for n in range(29)] + [LONG_LINE]
UNTIL_STOPPED = "print('ready', flush=True); import time; time.sleep(600)"
PROGRAMS: dict[str, tuple[list[str], FakeProgram]] = {
    "exits-3": (
        python("print('one'); print('two'); import sys; sys.exit(3)"),
        FakeProgram(output=b"one\ntwo\n", exit_code=3),
    ),
    "exits-on-sigterm": (
        python("import signal, sys; signal.signal(15, lambda *_: sys.exit(0)); " + UNTIL_STOPPED),
        FakeProgram(output=b"ready\n", on_terminate=0),
    ),
    "ignores-sigterm": (
        python("import signal; signal.signal(15, signal.SIG_IGN); " + UNTIL_STOPPED),
        FakeProgram(output=b"ready\n", on_terminate=None),
    ),
    "thirty-lines-the-last-long": (
        python(f"print({chr(10).join(LINES)!r})"),
        FakeProgram(output=("\n".join(LINES) + "\n").encode(), exit_code=0),
    ),
}


@dataclass
class Backend:
    """A runtime, and how it names a program; a sandbox's layout under `base`, as the agent
    makes it: the working directory `app/` and, beside it, `output.log`."""

    runtime: Runtime
    command: Callable[[str], list[str]]
    base: Path

    @property
    def log(self) -> Path:
        return self.base / "output.log"

    async def start(self, program: str, workdir: str = "app") -> SandboxProcess:
        env = {"PATH": os.environ["PATH"]}
        return await self.runtime.start(self.command(program), env, self.base / workdir, self.log)


@pytest.fixture(params=["process", "fake"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    (tmp_path / "app").mkdir()
    if request.param == "process":
        yield Backend(ProcessRuntime(), lambda name: PROGRAMS[name][0], tmp_path)
        return
    async with FakeRuntime({name: fake for name, (_, fake) in PROGRAMS.items()}) as runtime:
        yield Backend(runtime, lambda name: [name], tmp_path)


async def pump_until_ready(
    process: SandboxProcess, tasks: anyio.abc.TaskGroup, forwarded: bytearray
) -> None:
    """Pump in the background; return once the program said it is ready."""
    ready = anyio.Event()

    def forward(chunk: bytes) -> None:
        forwarded.extend(chunk)
        if b"ready\n" in forwarded:
            ready.set()

    tasks.start_soon(process.pump, forward)
    await ready.wait()


async def test_pump_forwards_all_output_and_logs_it_and_wait_returns_the_exit_code(
    backend: Backend,
) -> None:
    process = await backend.start("exits-3")
    assert process.pid > 0
    forwarded = bytearray()
    with anyio.fail_after(20):
        await process.pump(forwarded.extend)  # returns: the process closed its output
        assert await process.wait() == 3
    assert forwarded == b"one\ntwo\n"
    assert backend.log.read_bytes() == forwarded
    assert process.tail() == "one\ntwo"


async def test_stop_sends_sigterm_and_returns_the_code_the_process_exits_with(
    backend: Backend,
) -> None:
    process = await backend.start("exits-on-sigterm")
    forwarded = bytearray()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            await pump_until_ready(process, tasks, forwarded)
            assert await process.stop(grace=20) == 0
        # the pump ended with the process, and the code stays what stop returned
        assert await process.wait() == 0
    assert forwarded == b"ready\n"


async def test_a_process_that_ignores_sigterm_is_killed_once_the_grace_is_over(
    backend: Backend,
) -> None:
    process = await backend.start("ignores-sigterm")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            await pump_until_ready(process, tasks, bytearray())
            assert await process.stop(grace=0.2) == -signal.SIGKILL
        assert await process.wait() == -signal.SIGKILL


async def test_stopping_a_process_that_already_exited_returns_its_exit_code(
    backend: Backend,
) -> None:
    process = await backend.start("exits-3")
    with anyio.fail_after(20):
        await process.pump(lambda chunk: None)
        assert await process.wait() == 3
        assert await process.stop(grace=1) == 3


async def test_the_tail_is_the_last_lines_each_cut_to_its_last_1000_characters(
    backend: Backend,
) -> None:
    process = await backend.start("thirty-lines-the-last-long")
    with anyio.fail_after(20):
        await process.pump(lambda chunk: None)
        assert await process.wait() == 0
    expected = [*LINES[30 - TAIL_LINES : -1], LONG_LINE[-1000:]]
    assert process.tail().splitlines() == expected


async def test_a_start_in_a_missing_working_directory_fails_with_an_os_error(
    backend: Backend,
) -> None:
    with pytest.raises(FileNotFoundError):
        await backend.start("exits-3", workdir="missing")
