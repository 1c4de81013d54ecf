"""What one isolated sandbox holds on the node (uid, cgroup, mounted tree) and how its
processes are found and signalled; released once when it ends."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from wakeful.domain.models import Resources, format_size

from .cgroups import SandboxCgroup
from .tmpfs import unmount

log = logging.getLogger(__name__)


class Jailed:
    """What one isolated sandbox holds on the node, released once when it ends."""

    def __init__(self, limits: Resources, uid: int | None) -> None:
        self.limits = limits
        self.uid = uid
        self.cgroup: SandboxCgroup | None = None
        self.mounted: Path | None = None
        """Its tmpfs (`mount_sandbox_fs`), unmounted when it ends."""
        self.home: Path | None = None
        """A directory of its own besides its sandbox directory (a warm slot's), removed then."""
        self.listening: Callable[[], bool] | None = None
        """Whether the app listens in its own network namespace (an image app's)."""
        self.after_tree: list[Callable[[], None]] = []
        """Called once its tree is let go of (an image app's hold on its cached image)."""
        self._oom = False
        self._released = False

    def signal(self, pid: int, signum: int) -> None:
        """SIGTERM reaches the app and everything it started (not bwrap, whose death would
        kill them at once); SIGKILL goes to bwrap too, and the kernel empties the namespace.
        With cgroups, the processes are the cgroups' members (every process of the sandbox,
        none other): /proc is read for those alone, not scanned whole (on a node stopping
        many sandboxes, a scan per signal was its busiest code)."""
        members = None if self.cgroup is None else self.cgroup.pids_in()
        parents = _parent_map(members)
        tree = _below(parents, pid)
        init = set(parents.get(pid, []))
        targets = [p for p in tree if p not in init] if signum != signal.SIGKILL else tree
        if signum == signal.SIGKILL:
            targets.append(pid)
        for target in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signum)

    def stop_all(self, pid: int) -> list[int]:
        """SIGSTOP to `pid` and everything under it (bwrap, and every process of the PID
        namespace); the pids stopped, for SIGCONT (`stop_tree`)."""
        return stop_tree(pid, None if self.cgroup is None else self.cgroup.pids_in)

    def release(self, *, keep_tree: bool = False) -> None:
        """Its cgroup, and its tree unless `keep_tree` (then `release_tree` lets go of it)."""
        if self._released:
            return
        self._released = True
        if self.cgroup is not None:
            self._oom = self.cgroup.oom_kills() > 0
            self.cgroup.remove()
        if not keep_tree:
            self.release_tree()

    def release_tree(self) -> None:
        mounted, self.mounted = self.mounted, None
        if mounted is not None:
            unmount(mounted)
        home, self.home = self.home, None
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        after, self.after_tree = self.after_tree, []
        for done in after:  # each, whatever another raised (a pasta left running)
            try:
                done()
            except Exception:
                log.exception("releasing a sandbox's holding failed")

    def reason(self) -> str | None:
        return oom_message(self.limits) if self._oom else None


def oom_message(limits: Resources) -> str:
    return f"killed: out of memory (limit {format_size(limits.memory)})"


def memfile(name: str, data: bytes) -> int:
    """An anonymous file in memory (memfd) holding `data`, at its start, for bwrap or a step
    of the chain to read (the environment, `--seccomp`, the slot program): nothing of it in a
    command line, and never on a disk. Close-on-exec: passed on only as `pass_fds` names it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parent_map(only: set[int] | None = None) -> dict[int, list[int]]:
    """Children by parent, for the processes `only` (every process when None)."""
    found: dict[int, list[int]] = {}
    pids = (
        only if only is not None else (int(e.name) for e in os.scandir("/proc") if e.name.isdigit())
    )
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        found.setdefault(int(fields[1]), []).append(pid)
    return found


def _below(tree: dict[int, list[int]], pid: int) -> list[int]:
    found, todo = [], list(tree.get(pid, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def stop_tree(pid: int, members: Callable[[], set[int]] | None = None) -> list[int]:
    """SIGSTOP to `pid` and every process under it (read from /proc, or among `members()`),
    again until a pass finds no new one (a process may fork meanwhile), at most 5 passes: a
    process that forks faster than that can outrun it (the cgroup freezer cannot be
    outrun). Returns the pids stopped, for SIGCONT."""
    stopped: list[int] = []
    for _ in range(5):
        tree = [pid, *_below(_parent_map(None if members is None else members()), pid)]
        new = [p for p in tree if p not in stopped]
        if not new:
            break
        for target in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signal.SIGSTOP)
            stopped.append(target)
    return stopped


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (not `pid` itself), read from /proc."""
    return _below(_parent_map(), pid)
