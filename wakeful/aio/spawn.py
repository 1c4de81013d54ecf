"""Starting a child process without stalling the event loop, on asyncio and on uvloop alike.

`asyncio.create_subprocess_exec` on uvloop (and so `anyio.run_process` and `open_process`)
goes through libuv's `uv_spawn`, which forks the whole process and waits for the child's exec:

- measured here, 10 ms of a blocked loop per start for a process of ~200 MB (`wakeful up`
  serves the ingress on that loop), against ~0.9 ms for `subprocess.Popen`, which uses vfork;
- a fork runs grpc's fork handlers (etcd's client), and in a process whose grpc threads are
  busy the child sometimes dies of SIGSEGV before its exec: measured here, 1 start in 400
  of `umoci` on a uvloop with etcd calls in flight, none in 400 through `Popen`.

So every child a piece starts (sandboxes, pasta, umoci, cp, skopeo) starts with `Popen`, and
the pipes are attached to the running loop here; a pidfd tells it when the child exited (a
thread waits instead where the kernel has no pidfd). Only the child's own pid is ever reaped,
so neither loop's child handling is disturbed.

`Child` has the part of `asyncio.subprocess.Process` the pieces use: `pid`, `returncode`,
`stdin`, `stdout`, `stderr`, `wait()`, `send_signal()` and `kill()`. `run_tool` is
`anyio.run_process` for a tool: its exit status and the tail of what it said.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import anyio

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


class Child:
    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
        stderr: asyncio.StreamReader | None = None,
    ) -> None:
        self._popen = popen
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._watch()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status once `wait` could have returned it (a signal's as its negative)."""
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, signum: int) -> None:
        """Nothing once it is reaped: its pid may be another process's by then."""
        if self._exited.done():
            raise ProcessLookupError(self.pid)
        self._popen.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, unless it was reaped already."""
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self._popen.pid)
        except (AttributeError, OSError):  # no pidfd: a thread waits
            waiting = loop.run_in_executor(None, self._popen.wait)
            waiting.add_done_callback(lambda done: self._exit(done.result()))
            return

        def readable() -> None:
            code = self._popen.poll()
            if code is None:
                return
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._exit(code)

        loop.add_reader(pidfd, readable)

    def _exit(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)


async def spawn(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    stdin: int = DEVNULL,
    stdout: int = PIPE,
    stderr: int = STDOUT,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Start `argv` in a session of its own; PIPE ends come back as streams on this loop."""
    loop = asyncio.get_running_loop()
    popen = subprocess.Popen(  # noqa: ASYNC220 -- vfork: ~1 ms, less than a thread hop
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    try:
        writer = None
        if popen.stdin is not None:
            writer = await _writer(loop, popen.stdin)
        reader = await _reader(loop, popen.stdout)
        errors = await _reader(loop, popen.stderr)
        return Child(popen, writer, reader, errors)
    except BaseException:
        popen.kill()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        popen.wait()
        raise


async def _writer(loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)


async def _reader(
    loop: asyncio.AbstractEventLoop, pipe: IO[bytes] | None
) -> asyncio.StreamReader | None:
    if pipe is None:
        return None
    reader = asyncio.StreamReader(limit=2**16)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


TAIL_BYTES = 8192
"""What `run_tool` keeps of a tool's output: its last words, never all of it."""


@dataclass(frozen=True)
class Finished:
    returncode: int
    said: bytes
    """The last `TAIL_BYTES` of its stdout and stderr, as it wrote them."""

    def last_line(self) -> str:
        """Its last line of output, else its exit status (a signal's as its negative)."""
        lines = self.said.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else str(self.returncode)


async def run_tool(
    argv: Sequence[str], *, cwd: Path | str = "/", env: Mapping[str, str] | None = None
) -> Finished:
    """Run the tool `argv` to its end, as `anyio.run_process(check=False)` would but through
    `spawn`; killed (and reaped) when the caller is cancelled."""
    child = await spawn(argv, cwd=cwd, env=os.environ if env is None else env)
    said = bytearray()
    try:
        assert child.stdout is not None
        while chunk := await child.stdout.read(65536):
            said.extend(chunk)
            del said[:-TAIL_BYTES]
        returncode = await child.wait()
    finally:
        if child.returncode is None:
            child.kill()
            with anyio.CancelScope(shield=True):
                await child.wait()
    return Finished(returncode, bytes(said))
