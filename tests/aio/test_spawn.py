"""`spawn` and `run_tool`: children started through `Popen`'s vfork, never a fork of the piece.

A fork of a piece on uvloop (`anyio.run_process`, `open_process`, asyncio's subprocess
functions all go through libuv's `uv_spawn` there) runs grpc's fork handlers; beside etcd calls
in flight the child sometimes died of SIGSEGV before its exec (umoci, 1 start in 400 here), and
a deploy's image then "failed to boot". The last test keeps every such call out of the code."""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import contextlib
import gc
import glob
import io
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
import uvloop

from wakeful.aio.spawn import (
    TAIL_BYTES,
    _LoopOwned,
    connect_read_pipe,
    connect_write_pipe,
    run_tool,
)

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


def sources() -> list[Path]:
    """Every module of the package, the linked folders' (activator/, ingress/, ...) with them:
    `Path.rglob` does not go into a linked folder in Python 3.11, `glob` does."""
    return [Path(name) for name in glob.glob(str(WAKEFUL / "**" / "*.py"), recursive=True)]


def test_the_sources_take_in_the_linked_folders() -> None:
    assert WAKEFUL / "ingress" / "workers.py" in sources()


def test_no_piece_starts_a_child_through_a_fork_of_itself() -> None:
    found = {
        f"{path.relative_to(WAKEFUL.parent)}:{line}"
        for path in sources()
        for line in forking_calls(ast.parse(path.read_text(), str(path)))
    }
    assert not found, f"start these through wakeful.aio.spawn instead: {sorted(found)}"


class Probe(io.FileIO):
    """A pipe's file object that opens a pipe of its own (the canary) as it closes: the lowest
    free numbers, so the number of a descriptor closed just before, if there is one. A second
    close of that number then closes the canary (uvloop's transports did: libuv closed the
    descriptor, then the file object closed the same number again)."""

    def __init__(self, fd: int, mode: str) -> None:
        super().__init__(fd, mode)
        self.canaries: list[int] = []

    def close(self) -> None:
        if not self.closed:
            self.canaries += os.pipe()
        super().close()


def closed_once(probes: list[Probe]) -> None:
    """The one probe was closed, and no number after it: its canaries are all open."""
    (probe,) = probes
    assert probe.closed and probe.canaries
    assert all(alive(fd) for fd in probe.canaries), "a number was closed twice"
    for fd in probe.canaries:
        os.close(fd)


def alive(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def on_its_loop(kind: str, main: Callable[[], Awaitable[None]]) -> None:
    """`main` on a new loop of that kind (uvloop, as the pieces run; asyncio's own, as the
    tests do), in a thread of its own: not the session's loop."""

    async def run() -> None:
        await main()

    runner = uvloop.run if kind == "uvloop" else asyncio.run
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(runner, run()).result(timeout=10)


class Ends(asyncio.Protocol):
    def __init__(self) -> None:
        self.lost = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(None)


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_a_read_pipe_is_closed_once(kind: str) -> None:
    probes: list[Probe] = []

    async def main() -> None:
        read_end, write_end = os.pipe()
        probe = Probe(read_end, "rb")
        probes.append(probe)
        pipe = identity(read_end)
        transport, ends = await connect_read_pipe(asyncio.get_running_loop(), Ends, probe)
        given = transport.get_extra_info("pipe")
        if kind == "uvloop":  # libuv closes the descriptor: its file object must not
            assert given.closefd is False and given is not probe
        number = given.fileno()
        os.close(write_end)  # the end: the transport closes
        await ends.lost
        del transport
        gc.collect()
        if alive(number):  # closed, or since another file's: not the pipe's any more
            assert identity(number) != pipe

    on_its_loop(kind, main)
    closed_once(probes)


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_a_write_pipe_is_closed_once(kind: str) -> None:
    probes: list[Probe] = []

    async def main() -> None:
        read_end, write_end = os.pipe()
        probe = Probe(write_end, "wb")
        probes.append(probe)
        transport, ends = await connect_write_pipe(asyncio.get_running_loop(), Ends, probe)
        transport.write(b"said")
        transport.close()
        await ends.lost
        assert os.read(read_end, 64) == b"said"
        assert os.read(read_end, 64) == b""  # the write end is closed
        os.close(read_end)
        del transport
        gc.collect()

    on_its_loop(kind, main)
    closed_once(probes)


def identity(fd: int) -> tuple[int, int]:
    """What file a descriptor names: its device and inode."""
    found = os.fstat(fd)
    return found.st_dev, found.st_ino


def holding(file: tuple[int, int]) -> list[int]:
    """The descriptors of this process open on that file."""
    found = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            if identity(fd) == file:
                found.append(fd)
    return found


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_a_pipe_whose_connecting_is_cancelled_is_closed_once(kind: str) -> None:
    probes: list[Probe] = []

    async def main() -> None:
        read_end, write_end = os.pipe()
        pipe = identity(read_end)
        probe = Probe(read_end, "rb")
        probes.append(probe)
        loop = asyncio.get_running_loop()
        connecting = loop.create_task(connect_read_pipe(loop, Ends, probe))
        await asyncio.sleep(0)  # it steps to its wait for the transport, made by now
        connecting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await connecting
        for _ in range(3):  # asyncio's transport closes its file a turn later
            await asyncio.sleep(0)
        gc.collect()
        assert holding(pipe) == [write_end]
        os.close(write_end)

    on_its_loop(kind, main)
    closed_once(probes)


def test_a_failed_connect_leaves_a_number_taken_since_alone() -> None:
    """uvloop's transport closed the duplicate as its connecting failed, and the number was
    another pipe's before `release`: that pipe stays open."""

    async def main() -> None:
        read_end, write_end = os.pipe()
        owned = _LoopOwned(asyncio.get_running_loop(), io.FileIO(read_end, "rb"), "rb")
        os.close(owned.file.fileno())  # as libuv closes it
        taken, other_end = os.pipe()  # the lowest free numbers: the duplicate's among them
        try:
            assert owned.file.fileno() in (taken, other_end)
            owned.release()
            assert alive(taken) and alive(other_end)
        finally:
            for fd in (write_end, taken, other_end):
                os.close(fd)

    on_its_loop("uvloop", main)


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_a_tool_run_on_either_loop_says_what_it_said(kind: str) -> None:
    async def main() -> None:
        done = await run_tool([sys.executable, "-c", "print('one'); print('two')"])
        assert (done.returncode, done.last_line()) == (0, "two")

    on_its_loop(kind, main)


def test_no_piece_connects_a_pipe_but_through_spawn() -> None:
    found = [
        f"{path.relative_to(WAKEFUL.parent)}:{node.lineno}"
        for path in sources()
        if path.name != "spawn.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute)
        and node.attr in ("connect_read_pipe", "connect_write_pipe")
    ]
    assert not found, f"uvloop closes the descriptor twice: use wakeful.aio.spawn's {found}"
