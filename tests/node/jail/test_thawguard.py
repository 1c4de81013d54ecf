"""The guard that thaws an agent's frozen sandboxes once the agent is gone
(`wakeful.node.jail.thawguard`), on plain files standing in for the freezer hierarchy: it outlives
the signals a stop sends, acts only when the agent's pipe ends, and thaws only the sandboxes
its agent left directories for."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from wakeful.node.jail.thawguard import ThawGuard


def test_the_guard_thaws_its_agents_sandboxes_once_the_pipe_ends(tmp_path: Path) -> None:
    sandboxes, freezer = tmp_path / "sandboxes", tmp_path / "freezer"
    for sandbox_id in ("mine-1", "mine-2"):
        (sandboxes / sandbox_id).mkdir(parents=True)
    for sandbox_id in ("mine-1", "mine-2", "theirs-1"):  # theirs: another agent's
        (freezer / sandbox_id).mkdir(parents=True)
        (freezer / sandbox_id / "freezer.state").write_text("FROZEN")
    guard = ThawGuard.start(sandboxes, freezer)
    process = guard._process
    ignoring(process.pid, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a stop's signals
        process.send_signal(signum)  # ignored: dropped as they are sent
    assert process.poll() is None  # still there: it ends only with the pipe
    assert states(freezer) == {"mine-1": "FROZEN", "mine-2": "FROZEN", "theirs-1": "FROZEN"}
    guard.close()  # the pipe ends: as when the agent dies, however it dies
    assert process.returncode == 0
    assert states(freezer) == {"mine-1": "THAWED", "mine-2": "THAWED", "theirs-1": "FROZEN"}


def test_a_killed_agents_pipe_ends_too(tmp_path: Path) -> None:
    """The agent, a separate process here, is SIGKILLed: its guard still thaws."""
    (tmp_path / "sandboxes" / "sb-1").mkdir(parents=True)
    (tmp_path / "freezer" / "sb-1").mkdir(parents=True)
    (tmp_path / "freezer" / "sb-1" / "freezer.state").write_text("FROZEN")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from wakeful.node.jail.thawguard import ThawGuard\n"
            f"guard = ThawGuard.start(Path({str(tmp_path / 'sandboxes')!r}),"
            f" Path({str(tmp_path / 'freezer')!r}))\n"
            "print(guard.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    assert agent.stdout is not None
    with agent.stdout:
        guard_pid = int(agent.stdout.readline())
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 60
    while (tmp_path / "freezer" / "sb-1" / "freezer.state").read_text() != "THAWED":
        assert time.monotonic() < deadline, "the guard did not thaw"
        time.sleep(0.02)
    while Path(f"/proc/{guard_pid}").exists() and _state(guard_pid) != "Z":
        assert time.monotonic() < deadline, "the guard did not end"
        time.sleep(0.02)


def ignoring(pid: int, signals: Iterable[signal.Signals]) -> None:
    """Wait until the process ignores these signals (its start is over: they come last)."""
    wanted = sum(1 << (signum - 1) for signum in signals)
    deadline = time.monotonic() + 60
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        mask = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
        if mask & wanted == wanted:
            return
        assert time.monotonic() < deadline, "the guard never ignored the signals"
        time.sleep(0.01)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def states(freezer: Path) -> dict[str, str]:
    return {d.name: (d / "freezer.state").read_text() for d in sorted(freezer.iterdir())}
