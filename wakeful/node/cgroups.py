"""The sandbox's cgroups (v1 `memory` and `pids`), where the node may write them: created with
the app's limits before it starts, read for OOM kills when it ends, swept when left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from wakeful.domain.models import Resources

CGROUP_V1 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Cgroups:
    """The v1 `memory` and `pids` hierarchies' `wakeful/` directories, when writable."""

    memory: Path
    pids: Path

    @classmethod
    def detect(cls, root: Path = CGROUP_V1) -> Cgroups | None:
        memory, pids = root / "memory" / "wakeful", root / "pids" / "wakeful"
        try:
            for path in (memory, pids):
                path.mkdir(exist_ok=True)
                (path / "cgroup.procs").stat()
        except OSError:
            return None
        return cls(memory, pids)

    def sandbox(self, sandbox_id: str) -> SandboxCgroup:
        return SandboxCgroup(self.memory / sandbox_id, self.pids / sandbox_id)

    def sweep(self, older_than: float = 30.0) -> int:
        """Remove sandbox cgroups left empty (a kernel still tearing a namespace down refuses
        the first rmdir; an agent that crashed never tried). Only ones untouched for
        `older_than` seconds: a fresh one may be waiting for its sandbox to join it."""
        removed = 0
        now = time.time()
        for root in (self.memory, self.pids):
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


@dataclass(frozen=True)
class SandboxCgroup:
    memory: Path
    pids: Path

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
        """Kill what is left, then remove both directories (a cgroup with members stays)."""
        for pid in self.pids_in():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for path in (self.memory, self.pids):
            with contextlib.suppress(OSError):
                path.rmdir()
