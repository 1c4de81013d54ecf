"""What one isolated sandbox holds on the node (uid, cgroup, mounted tree) and how its
processes are found and signalled; released once when it ends."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

from wakeful.domain.models import Resources

from .cgroups import SandboxCgroup
from .hardening import oom_message, unmount


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
        self._oom = False
        self._released = False

    def signal(self, pid: int, signum: int) -> None:
        """SIGTERM reaches the app and everything it started (not bwrap, whose death would
        kill them at once); SIGKILL goes to bwrap too, and the kernel empties the namespace."""
        tree = descendants(pid)
        init = set(children(pid))
        targets = [p for p in tree if p not in init] if signum != signal.SIGKILL else tree
        if signum == signal.SIGKILL:
            targets.append(pid)
        for target in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signum)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.cgroup is not None:
            self._oom = self.cgroup.oom_kills() > 0
            self.cgroup.remove()
        if self.mounted is not None:
            unmount(self.mounted)
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)

    def reason(self) -> str | None:
        return oom_message(self.limits) if self._oom else None


def sealed(path: Path, data: bytes) -> int:
    """An open, already unlinked 0600 file holding `data` for bwrap to read (`--args`,
    `--seccomp`): nothing of it in a command line or left on disk."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.unlink(path)
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parent_map() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        found.setdefault(int(fields[1]), []).append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    return _parent_map().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (not `pid` itself), read from /proc."""
    tree = _parent_map()
    found, todo = [], list(tree.get(pid, []))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found
