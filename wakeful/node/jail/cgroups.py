"""The sandbox's cgroups (v1 `memory` and `pids`), where the node may write them: created with
the app's limits before it starts, read for OOM kills when it ends, swept when left behind.
A v1 `freezer` cgroup is made when a sandbox is first suspended (the suspended tier): its
processes join it then, off any request's path, and it is thawed before anything kills them
(v1 delivers no signal, not even SIGKILL, to a frozen task)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from wakeful.domain.models import Resources

from .thawguard import thaw_cgroup

CGROUP_V1 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Cgroups:
    """The v1 `memory` and `pids` hierarchies' `wakeful/` directories, when writable."""

    memory: Path
    pids: Path
    freezer: Path | None = None
    """The v1 `freezer` hierarchy's `wakeful/`, when writable (else SIGSTOP suspends)."""

    @classmethod
    def detect(cls, root: Path = CGROUP_V1) -> Cgroups | None:
        memory, pids = root / "memory" / "wakeful", root / "pids" / "wakeful"
        try:
            for path in (memory, pids):
                path.mkdir(exist_ok=True)
                (path / "cgroup.procs").stat()
        except OSError:
            return None
        freezer: Path | None = root / "freezer" / "wakeful"
        try:
            assert freezer is not None
            freezer.mkdir(exist_ok=True)
            (freezer / "cgroup.procs").stat()
        except OSError:
            freezer = None
        return cls(memory, pids, freezer)

    def sandbox(self, sandbox_id: str) -> SandboxCgroup:
        freezer = None if self.freezer is None else self.freezer / sandbox_id
        return SandboxCgroup(self.memory / sandbox_id, self.pids / sandbox_id, freezer)

    def sweep(self, older_than: float = 30.0) -> int:
        """Remove sandbox cgroups left empty (a kernel still tearing a namespace down refuses
        the first rmdir; an agent that crashed never tried). Only ones untouched for
        `older_than` seconds: a fresh one may be waiting for its sandbox to join it."""
        removed = 0
        now = time.time()
        roots = [self.memory, self.pids] + ([] if self.freezer is None else [self.freezer])
        for root in roots:
            for path in root.iterdir():
                try:
                    if not path.is_dir() or now - path.stat().st_mtime < older_than:
                        continue
                    if (path / "cgroup.procs").read_text().strip():
                        continue
                    path.rmdir()
                    removed += 1
                except OSError:
                    continue
        return removed


FROZEN_WAIT = 2.0
"""Seconds a freeze waits for the kernel to say FROZEN (a task in uninterruptible sleep can
hold it in FREEZING) before it gives up and thaws."""


@dataclass(frozen=True)
class SandboxCgroup:
    memory: Path
    pids: Path
    freezer: Path | None = None

    def freeze(self) -> bool:
        """Freeze every process of the sandbox (its `memory` and `pids` members join its
        freezer cgroup first, again until none is left out: one may fork meanwhile). False
        when there is no freezer, or the kernel did not freeze it in `FROZEN_WAIT` (then it
        is thawed again). Blocking: call it off the event loop."""
        if self.freezer is None:
            return False
        self.freezer.mkdir(exist_ok=True)
        state = self.freezer / "freezer.state"
        for _ in range(10):
            inside = self._frozen_members()
            for pid in self.pids_in() - inside:
                with contextlib.suppress(OSError):  # it ended meanwhile
                    (self.freezer / "cgroup.procs").write_text(str(pid))
            state.write_text("FROZEN")
            deadline = time.monotonic() + FROZEN_WAIT
            while state.read_text().strip() != "FROZEN":
                if time.monotonic() > deadline:
                    thaw_cgroup(self.freezer)
                    return False
                time.sleep(0.001)
            if self.pids_in() <= self._frozen_members():
                return True
        thaw_cgroup(self.freezer)
        return False

    def thaw(self) -> None:
        """Thaw it (one small write: cheap enough for the event loop)."""
        if self.freezer is not None:
            thaw_cgroup(self.freezer)

    def _frozen_members(self) -> set[int]:
        assert self.freezer is not None
        with contextlib.suppress(OSError, ValueError):
            return {int(p) for p in (self.freezer / "cgroup.procs").read_text().split()}
        return set()

    def memory_held(self) -> int:
        """Bytes charged to the sandbox's memory cgroup (its tmpfs included)."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.memory / "memory.usage_in_bytes").read_text())
        return 0

    def create(self, limits: Resources) -> None:
        for path in (self.memory, self.pids):
            path.mkdir(exist_ok=True)
        # memory+swap may never be below memory alone: raising both goes memsw first,
        # lowering goes memory first; writing memsw on both sides covers either.
        memsw = self.memory / "memory.memsw.limit_in_bytes"
        with contextlib.suppress(OSError):  # no swap accounting: memory alone is the bound
            memsw.write_text(str(limits.memory))
        (self.memory / "memory.limit_in_bytes").write_text(str(limits.memory))
        with contextlib.suppress(OSError):
            memsw.write_text(str(limits.memory))
        (self.pids / "pids.max").write_text(str(limits.processes))

    def procs_files(self) -> list[str]:
        return [str(self.memory / "cgroup.procs"), str(self.pids / "cgroup.procs")]

    def join_prefix(self, sh: str) -> list[str]:
        """argv that moves itself into both cgroups, then execs the argv that follows it."""
        files = self.procs_files()
        joins = " && ".join(f'echo $$ > "${n}"' for n in range(1, len(files) + 1))
        return [sh, "-c", f'{joins} && shift {len(files)} && exec "$@"', "sh", *files]

    def pids_in(self) -> set[int]:
        found: set[int] = set()
        for path in (self.memory, self.pids):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return found

    def oom_kills(self) -> int:
        """How many of the sandbox's processes the kernel killed for memory."""
        try:
            text = (self.memory / "memory.oom_control").read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        """Kill what is left (thawed first), then remove the directories (a cgroup with
        members stays)."""
        self.thaw()
        for pid in self.pids_in():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for path in (self.memory, self.pids, self.freezer):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.rmdir()
