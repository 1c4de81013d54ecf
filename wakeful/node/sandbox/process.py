"""One sandbox's process on this node, as `ProcessRuntime` started it: its output copied into
an `OutputLog`, frozen and thawed (the suspended tier), signalled and stopped, its exit awaited
(noticed the moment the process ends, not by polling).

An isolated sandbox is found and signalled through its `Jailed` (every process of its PID
namespace, its cgroup); an unisolated one through its process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from wakeful.aio.spawn import Child
from wakeful.node.jail.jailed import Jailed, stop_tree

from .output import OutputLog
from .ports import listeners


class LocalProcess:
    """A sandbox's process, as `ProcessRuntime` started it (the real `SandboxProcess`)."""

    def __init__(
        self,
        process: Child,
        log_path: Path,
        max_log_bytes: int,
        jailed: Jailed | None = None,
        on_settled: Callable[[], None] | None = None,
        *,
        app_dir: Path | None = None,
        keep_tree: bool = False,
    ):
        self._process = process
        self._on_settled = on_settled
        self._jailed = jailed
        self._app_dir = app_dir if app_dir is not None else log_path.with_name("app")
        self._keep_tree = keep_tree
        self._output = OutputLog(log_path, max_log_bytes)
        self._freezing = asyncio.Lock()
        self._frozen: list[int] | None = None
        """While frozen: the pids SIGSTOP stopped ([] when the cgroup freezer holds it)."""
        self._freeze_work: asyncio.Future[int] | None = None
        self._stopping = False

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
                self._output.add(chunk)
                if forward is not None:
                    forward(chunk)
        finally:
            self._output.close()

    @property
    def dropped(self) -> int:
        """Output bytes the log file could not take (a full disk); the pipe was drained."""
        return self._output.dropped

    def settled(self) -> None:
        on_settled, self._on_settled = self._on_settled, None
        if on_settled is not None:
            on_settled()

    async def wait(self) -> int:
        code = await self._process.wait()
        self.settled()
        if self._jailed is not None:  # a few file operations: cheap enough for the loop
            self._jailed.release(keep_tree=self._keep_tree)
        return code

    @property
    def app_dir(self) -> Path:
        return self._app_dir

    def dispose(self) -> None:
        if self._jailed is not None:
            self._jailed.release_tree()

    async def freeze(self) -> int:
        """The cgroup freezer where the sandbox has cgroups and the node a freezer hierarchy;
        else SIGSTOP to each of its processes (every process of its PID namespace; the
        process group when unisolated). Returns the bytes it holds: its memory cgroup's
        charge, else the resident size of what was stopped."""
        async with self._freezing:
            if self._stopping or self._frozen is not None or self._process.returncode is not None:
                return 0
            # In a thread that a cancelled caller does not cut short: it would go on and
            # freeze the sandbox unseen. A stop waits for it first (`_freeze_work`).
            work = asyncio.ensure_future(asyncio.to_thread(self._freeze_now))
            self._freeze_work = work
            return await asyncio.shield(work)

    def _freeze_now(self) -> int:
        jailed = self._jailed
        cgroup = None if jailed is None else jailed.cgroup
        if cgroup is not None and cgroup.freeze():
            self._frozen = []
            return cgroup.memory_held()
        pid = self._process.pid
        stopped = _stop_group(pid) if jailed is None else jailed.stop_all(pid)
        self._frozen = stopped
        return cgroup.memory_held() if cgroup is not None else resident_bytes(stopped)

    async def thaw(self) -> None:
        async with self._freezing:
            self._thaw()

    def _thaw(self) -> None:
        """Undo whatever a freeze did (idempotent): once any freeze began, the freezer cgroup
        is thawed whatever this process believes (a cut-short wait may not have seen it
        freeze); SIGCONT goes to every pid SIGSTOP stopped (no /proc walk on a wake), and to
        the process group of an unisolated sandbox. A sandbox never frozen is left alone."""
        frozen, self._frozen = self._frozen, None
        cgroup = None if self._jailed is None else self._jailed.cgroup
        if cgroup is not None and self._freeze_work is not None:  # a freeze ever began
            cgroup.thaw()
        for pid in frozen or ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
        if frozen and self._jailed is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGCONT)

    async def stop(self, grace: float) -> int:
        """SIGTERM to the sandbox's processes, SIGKILL to all of them after `grace` seconds
        (thawed first, once a freeze under way has ended: a frozen process takes no signal)."""
        self._stopping = True
        if self._freeze_work is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._freeze_work)
        async with self._freezing:
            self._thaw()
        await self._signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                return await self.wait()
        except TimeoutError:
            self._thaw()
            await self._signal(signal.SIGKILL)
            return await self.wait()

    async def _signal(self, signum: int) -> None:
        if self._process.returncode is not None:
            return  # reaped: its pid may already be another process's
        if self._jailed is not None:
            # Finding an isolated sandbox's processes reads /proc: not on the event loop.
            await asyncio.to_thread(self._jailed.signal, self._process.pid, signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def tail(self) -> str:
        return self._output.tail()

    def reason(self) -> str | None:
        return None if self._jailed is None else self._jailed.reason()

    @property
    def listening(self) -> Callable[[], bool] | None:
        return None if self._jailed is None else self._jailed.listening

    def owns_port(self, port: int) -> bool:
        """Only an isolated sandbox has a uid of its own to tell it by: every socket listening
        on `port` must be its. In a network namespace of its own, `port` is its forwarder's,
        which the node started for it alone."""
        if self._jailed is None or self._jailed.uid is None:
            return True
        if self._jailed.listening is not None:
            return True
        owners = listeners(port)
        return bool(owners) and all(owner == self._jailed.uid for owner in owners)


def _stop_group(pid: int) -> list[int]:
    """SIGSTOP to an unisolated sandbox's process group, then to every process under it (one
    in a session of its own too); the pids stopped, for SIGCONT (a thaw SIGCONTs the group
    as well)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGSTOP)
    return stop_tree(pid)


def resident_bytes(pids: Sequence[int]) -> int:
    """The resident memory of `pids` (shared pages counted once per process)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/statm", "rb") as statm,
        ):
            total += int(statm.read().split()[1]) * page
    return total
