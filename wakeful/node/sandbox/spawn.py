"""Starting a child process without stalling the event loop, on asyncio and on uvloop alike.

`asyncio.create_subprocess_exec` on uvloop goes through libuv's `uv_spawn`, which forks the
whole agent and waits for the child's exec: measured here, 10 ms of a blocked loop per start
for a process of ~200 MB (`wakeful up` serves the ingress on that loop), against ~0.9 ms for
`subprocess.Popen`, which uses vfork. So the node starts its processes with `Popen` and
attaches the pipes to the running loop itself; a pidfd tells it when the child exited (a
thread waits instead where the kernel has no pidfd). Only the child's own pid is ever reaped,
so neither loop's child handling is disturbed.

`Child` has the part of `asyncio.subprocess.Process` the node uses: `pid`, `returncode`,
`stdin`, `stdout`, `wait()` and `send_signal()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT


class Child:
    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: asyncio.StreamWriter | None,
        stdout: asyncio.StreamReader | None,
    ) -> None:
        self._popen = popen
        self.stdin = stdin
        self.stdout = stdout
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
        writer = reader = None
        if popen.stdin is not None:
            writer = await _writer(loop, popen.stdin)
        if popen.stdout is not None:
            reader = asyncio.StreamReader(limit=2**16)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
        return Child(popen, writer, reader)
    except BaseException:
        popen.kill()
        for pipe in (popen.stdin, popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        popen.wait()
        raise


async def _writer(loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, pipe)
    return asyncio.StreamWriter(transport, protocol, None, loop)
