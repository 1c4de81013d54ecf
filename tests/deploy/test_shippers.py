"""The log directory as a shipper reads it (issue 40): Debian's rsyslog, tailing the open
segments with its imfile module as Vector or Promtail would, gets every line exactly once while
segments close and new ones open, and each line it ships is the JSON record readers here
read."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wakeful.deploy import logread
from wakeful.deploy.logdir import LogDir, encode
from wakeful.domain.logfiles import Limits

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"
CONFIG = """
global(workDirectory="{work}" maxMessageSize="64k")
module(load="imfile" mode="inotify")
input(type="imfile" file="{root}/apps/*/output/*.jsonl" tag="wakeful" freshStartTail="off")
template(name="raw" type="string" string="%msg%\\n")
action(type="omfile" file="{out}" template="raw")
"""


@pytest.fixture
def shipper(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A running rsyslogd tailing `<tmp>/logs`; yields the log directory and what it ships."""
    if not Path(RSYSLOGD).exists():
        pytest.skip("rsyslogd is not installed (Debian's rsyslog: scripts/test installs it)")
    root, work, out = tmp_path / "logs", tmp_path / "work", tmp_path / "shipped.jsonl"
    (root / "apps/shop/output").mkdir(parents=True)
    work.mkdir()
    config = tmp_path / "rsyslog.conf"
    config.write_text(CONFIG.format(work=work, root=root, out=out))
    process = subprocess.Popen(
        [RSYSLOGD, "-n", "-f", str(config), "-i", str(tmp_path / "rsyslogd.pid")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(0.5)  # its inotify watches: lines written before are read anyway
        if process.poll() is not None:
            assert process.stderr is not None
            pytest.fail(f"rsyslogd did not start: {process.stderr.read().decode()[-500:]}")
        yield root, out
    finally:
        process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()


def shipped(out: Path) -> list[str]:
    return out.read_text().splitlines() if out.exists() else []


def test_a_tailing_shipper_gets_every_line_once_across_closed_segments(
    shipper: tuple[Path, Path],
) -> None:
    root, out = shipper
    limits = Limits(retention=86400, max_bytes=1 << 30, app_max_bytes=1 << 28)
    logdir = LogDir(root, "t1", limits, segment_bytes=8192, sync=False)
    logdir.start()
    start = time.time()
    written = []
    for batch in range(30):
        at = start + batch * 0.01
        lines = [
            encode({"ts": at, "app": "shop", "sandbox": "sb-1", "line": f"{batch}-{i} " + "x" * 80})
            for i in range(10)
        ]
        assert logdir.append("shop", "output", lines, at, at).result(timeout=10) == 0
        written += [line.decode().rstrip("\n") for line in lines]
    folder = root / "apps/shop/output"
    assert len([p for p in folder.iterdir() if p.name.endswith(".gz")]) >= 3  # it rotated
    deadline = time.monotonic() + 30
    while len(shipped(out)) < len(written) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # nothing more comes: no line twice
    logdir.stop()
    assert sorted(shipped(out)) == sorted(written)
    assert len(set(shipped(out))) == len(written)
    ours = [
        line.decode().rstrip("\n")
        for line in logread.forward(root, "shop", "output", logread.Query())
    ]
    assert ours == written  # what readers here read, in order
    assert all(json.loads(line)["app"] == "shop" for line in shipped(out))
