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
so neither loop's child handling is disturbed. A pipe is attached through `connect_read_pipe`
or `connect_write_pipe` (here, and for any pipe a piece reads on its loop), which leave its
descriptor to one owner: uvloop's own close it twice (`_LoopOwned`).

`Child` has the part of `asyncio.subprocess.Process` the pieces use: `pid`, `returncode`,
`stdin`, `stdout`, `stderr`, `wait()`, `send_signal()` and `kill()`. `run_tool` is
`anyio.run_process` for a tool: its exit status and the tail of what it said.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

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
    cwd: Path | str | None,
    env: Mapping[str, str],
    stdin: int = DEVNULL,
    stdout: int | None = PIPE,
    stderr: int | None = STDOUT,
    pass_fds: Sequence[int] = (),
) -> Child:
    """Start `argv` in a session of its own, in `cwd` (None: this process's); PIPE ends come
    back as streams on this loop (None: this process's own)."""
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
    made: list[asyncio.BaseTransport] = []
    try:
        writer = None
        if popen.stdin is not None:
            sending, protocol = await connect_write_pipe(
                loop, asyncio.streams.FlowControlMixin, popen.stdin
            )
            made.append(sending)
            writer = asyncio.StreamWriter(sending, protocol, None, loop)
        reader = await _reader(loop, popen.stdout, made)
        errors = await _reader(loop, popen.stderr, made)
        return Child(popen, writer, reader, errors)
    except BaseException:
        for transport in made:
            transport.close()
        popen.kill()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        popen.wait()
        raise


async def _reader(
    loop: asyncio.AbstractEventLoop,
    pipe: IO[bytes] | None,
    made: list[asyncio.BaseTransport],
) -> asyncio.StreamReader | None:
    if pipe is None:
        return None
    reader = asyncio.StreamReader(limit=2**16)
    transport, _ = await connect_read_pipe(loop, lambda: _UntilItsEnd(reader), pipe)
    made.append(transport)
    return reader


class _UntilItsEnd(asyncio.StreamReaderProtocol):
    """A child's output: its transport closes at its end (nothing more can come through a
    pipe), where `StreamReaderProtocol` keeps it open on uvloop, as a socket's half, until the
    collector takes it (asyncio's pipe transports close at the end whatever it says)."""

    def eof_received(self) -> bool:
        super().eof_received()
        return False


_Protocol = TypeVar("_Protocol", bound=asyncio.BaseProtocol)


async def connect_read_pipe(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], _Protocol], pipe: IO[bytes]
) -> tuple[asyncio.ReadTransport, _Protocol]:
    """`loop.connect_read_pipe`, with the pipe's descriptor closed once, by its transport
    (`_LoopOwned`); `pipe` is the transport's, or closed, when this returns or raises."""
    return await _attached(loop.connect_read_pipe, factory, _LoopOwned(loop, pipe, "rb"))


async def connect_write_pipe(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], _Protocol], pipe: IO[bytes]
) -> tuple[asyncio.WriteTransport, _Protocol]:
    """`loop.connect_write_pipe`, as `connect_read_pipe` is `loop.connect_read_pipe`."""
    return await _attached(loop.connect_write_pipe, factory, _LoopOwned(loop, pipe, "wb"))


_Transport = TypeVar("_Transport", bound=asyncio.BaseTransport)


async def _attached(
    connect: Callable[
        [Callable[[], _Protocol], IO[bytes]], Awaitable[tuple[_Transport, _Protocol]]
    ],
    factory: Callable[[], _Protocol],
    owned: _LoopOwned,
) -> tuple[_Transport, _Protocol]:
    try:
        return await connect(factory, owned.file)
    except (KeyboardInterrupt, SystemExit):
        owned.abandon()
        raise
    except BaseException:
        owned.release()
        raise


class _LoopOwned:
    """The file object to give a loop's pipe transport for `pipe`, so that one owner closes
    the descriptor, once.

    asyncio's transports close the file object alone: `pipe` itself. uvloop's (0.23) give the
    descriptor to libuv, which closes it, and then close the file object too: one number
    closed twice (MagicStack/uvloop#763). Between the two closes another thread (a thread-pool
    worker, grpc's) can open a file and be given that number, and the second close takes it
    away from it; through the collector in another thread, this loop's thread can be the one
    (a sandbox's environment memfd found closed as its `bwrap` started, EBADF, seen once in
    CI, is the likeliest trace of it), and a number taken so could name another sandbox's
    memfd as well. So uvloop gets a
    descriptor of its own (a duplicate) in a file object that never closes it, and `pipe` is
    closed here; so does any loop that is not asyncio's own."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes], mode: str) -> None:
        self._kept: tuple[int, int] | None = None
        self.file: IO[bytes] = pipe
        if isinstance(loop, asyncio.BaseEventLoop):
            return
        try:  # above 2: libuv never closes 0, 1 or 2, which a process started without them gives
            duplicate = fcntl.fcntl(pipe.fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
        except BaseException:
            pipe.close()
            raise
        try:
            found = os.fstat(duplicate)
            pipe.close()
            self.file = open(duplicate, mode, buffering=0, closefd=False)  # noqa: SIM115
        except BaseException:
            os.close(duplicate)
            raise
        self._kept = (found.st_dev, found.st_ino)

    def abandon(self) -> None:
        """uvloop leaves its transport open when its connecting is interrupted by
        KeyboardInterrupt or SystemExit: the descriptor is left to it (a leak, on the way
        out), where a close here would be the second."""
        if self._kept is None:
            self.release()

    def release(self) -> None:
        """Closed, when the loop did not take it: uvloop's transport closed the descriptor if
        libuv took it (and the number may be another file's by now), so it is closed here only
        while it still names the same pipe."""
        if self._kept is None:
            self.file.close()  # asyncio: the file object's own state, closed once whatever
            return
        fd = self.file.fileno()
        try:
            found = os.fstat(fd)
        except OSError:
            return
        if (found.st_dev, found.st_ino) == self._kept:
            os.close(fd)


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
