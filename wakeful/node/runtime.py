"""Running a sandbox as a local process: its own process group, a bounded log, prompt exit.

`Runtime` is the narrow interface the node agent needs; `ProcessRuntime` is the real one.
A sandbox's stdout and stderr go through a pipe into a log file that never grows past
`max_log_bytes` (it is rotated once to `<name>.1`), and the last lines stay in memory so a
crash can be reported with them. `pump` also hands every chunk it reads to a `forward`
callable (the node agent's log shipper), which must not block. Exit is noticed the moment
the process ends (we await it), not by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

log = logging.getLogger(__name__)
MAX_LOG_BYTES = 1024 * 1024
TAIL_LINES = 20
RECENT_BYTES = 16 * 1024


class SandboxProcess(Protocol):
    @property
    def pid(self) -> int: ...

    async def pump(self, forward: Callable[[bytes], None]) -> None: ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> int: ...

    def tail(self) -> str: ...


class Runtime(Protocol):
    async def start(
        self, command: Sequence[str], env: Mapping[str, str], workdir: Path, log_path: Path
    ) -> SandboxProcess: ...


def tail_of(recent: bytes | bytearray) -> str:
    """What a crash is reported with: the last `TAIL_LINES` lines, each cut to its last 1000
    characters."""
    lines = recent.decode(errors="replace").splitlines()
    return "\n".join(line[-1000:] for line in lines[-TAIL_LINES:])


def _guarded(command: Sequence[str]) -> list[str]:
    """Wrap the command so the sandbox gets SIGKILL if the node agent dies (Linux's parent-death
    signal, set by util-linux's `setpriv`, survives exec). Without it, shutdown still stops
    every sandbox; only a crashed agent could leave one behind."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or not sys.platform.startswith("linux"):
        return list(command)
    return [setpriv, "--pdeathsig", "KILL", "--", *command]


class LocalProcess:
    def __init__(self, process: asyncio.subprocess.Process, log_path: Path, max_log_bytes: int):
        self._process = process
        self._log_path = log_path
        self._max = max_log_bytes
        self._recent = bytearray()
        self._log: BinaryIO | None = None
        self._written = 0
        self.dropped = 0
        """Output bytes the log file could not take (a full disk); the pipe was drained."""

    @property
    def pid(self) -> int:
        return self._process.pid

    async def pump(self, forward: Callable[[bytes], None] | None = None) -> None:
        """Copy output into the bounded log file, and to `forward`, until the process closes
        its output.

        Reads in chunks, not lines: a line of any length (a minified blob, a binary dump)
        must not break the copy, nor the sandbox. Neither may a log file that cannot be
        written (a full disk): the pipe is still drained, so the app never blocks on it,
        `forward` still gets everything, and what the file missed is counted in `dropped`.
        """
        stream = self._process.stdout
        assert stream is not None
        try:
            while chunk := await stream.read(65536):
                self._recent += chunk
                del self._recent[: max(0, len(self._recent) - RECENT_BYTES)]
                self._append(chunk)
                if forward is not None:
                    forward(chunk)
        finally:
            self._close_log()

    def _append(self, chunk: bytes) -> None:
        try:
            if self._log is None:
                self._log = self._log_path.open("ab")
                self._written = self._log.tell()
            if self._written + len(chunk) > self._max:
                self._close_log()
                self._log_path.replace(self._log_path.with_name(self._log_path.name + ".1"))
                self._log = self._log_path.open("ab")
                self._written = 0
            self._log.write(chunk)
            self._log.flush()
            self._written += len(chunk)
        except OSError as exc:
            if not self.dropped:
                log.warning("cannot write %s, dropping output: %s", self._log_path, exc)
            self.dropped += len(chunk)
            self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    async def wait(self) -> int:
        return await self._process.wait()

    async def stop(self, grace: float) -> int:
        """SIGTERM to the process group, SIGKILL after `grace` seconds."""
        self._signal_group(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                return await self._process.wait()
        except TimeoutError:
            self._signal_group(signal.SIGKILL)
            return await self._process.wait()

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def tail(self) -> str:
        return tail_of(self._recent)


class ProcessRuntime:
    def __init__(self, max_log_bytes: int = MAX_LOG_BYTES) -> None:
        self._max_log_bytes = max_log_bytes

    async def start(
        self, command: Sequence[str], env: Mapping[str, str], workdir: Path, log_path: Path
    ) -> LocalProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        process = await asyncio.create_subprocess_exec(
            *_guarded(command),
            cwd=workdir,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        return LocalProcess(process, log_path, self._max_log_bytes)
