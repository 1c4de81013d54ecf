"""A guard that thaws an agent's frozen sandboxes when the agent dies without doing it itself
(SIGKILL, the OOM killer, a crash of the interpreter).

A task in a v1 frozen cgroup takes no signal, not even SIGKILL. A sandbox frozen when its agent
died would keep its processes (unkillable, even by an operator's `kill -9`), its memory and its
mounts until an agent started again on the same data directory. So an agent that can freeze
starts this guard first: a small process in a session of its own that ignores the signals a
stop sends (a terminal's Ctrl-C, systemd's SIGTERM) and reads a pipe only the agent holds. The
pipe ends when the agent does, however it ends. The guard then thaws the freezer cgroup of
every sandbox directory the agent left (its own sandboxes, not another agent's on the same
machine); their parent-death SIGKILL, pending since, then ends them. An agent that stops
cleanly has thawed and stopped its sandboxes already: the guard finds nothing frozen.

It imports nothing but the standard library, so it stays small (it lives as long as its agent),
and it runs as a script in Python's isolated mode from `/` (`python -I .../thawguard.py
SANDBOXES_DIR FREEZER_DIR`): no module of the directory it was started from, and no
`PYTHON*` variable, can stand in for any of it (it runs as root).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CLOSE_WAIT = 5.0
"""Seconds an agent that stops cleanly waits for its guard to finish."""


def thaw_cgroup(cgroup: Path) -> None:
    """Thaw one freezer cgroup (none there: nothing to do)."""
    with contextlib.suppress(OSError):  # never frozen, or gone meanwhile
        (cgroup / "freezer.state").write_text("THAWED")


def thaw_left(sandboxes: Path, freezer: Path) -> None:
    """Thaw the freezer cgroup (under `freezer`) of every sandbox directory under
    `sandboxes`: what an agent left, and only that agent's. Run by the guard when its agent
    is gone, and by an agent that starts, for what its crashed run left (if its guard died
    with it)."""
    try:
        left = [entry.name for entry in sandboxes.iterdir()]
    except OSError:
        return
    for sandbox_id in left:
        thaw_cgroup(freezer / sandbox_id)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 2:
        print("usage: thawguard.py SANDBOXES_DIR FREEZER_DIR", file=sys.stderr)
        return 2
    sandboxes, freezer = Path(args[0]), Path(args[1])
    with contextlib.suppress(OSError):  # with CAP_SYS_RESOURCE: the OOM killer passes it over
        Path("/proc/self/oom_score_adj").write_text("-1000")
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # the agent writes nothing: this returns at its end
        pass
    thaw_left(sandboxes, freezer)
    return 0


class ThawGuard:
    """The agent's side: the guard's process and the pipe's writing end."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @classmethod
    def start(cls, sandboxes: Path, freezer: Path) -> ThawGuard:
        process = subprocess.Popen(
            [sys.executable, "-I", __file__, str(sandboxes), str(freezer)],
            stdin=subprocess.PIPE,  # not inherited by sandboxes: close_fds, and CLOEXEC
            stdout=subprocess.DEVNULL,  # nor does it hold the agent's output open
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self._process.pid

    def ended(self) -> int | None:
        """Its exit code if it ended (it should not, while its agent lives), else None."""
        return self._process.poll()

    def close(self) -> int:
        """The agent stops cleanly: end the pipe and reap the guard (blocking, bounded).
        Returns its exit code (0: it thawed what was left, if anything)."""
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            return self._process.wait(CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.wait()


if __name__ == "__main__":
    sys.exit(main())
