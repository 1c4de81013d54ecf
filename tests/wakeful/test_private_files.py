"""The data directory is private: `wakeful up` (a real process, with a real sandbox) leaves
nothing in it that another user could read, list or enter; a data directory that was open is
tightened, and says so; the SQLite store is created private whatever the umask."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.up import make_app
from wakeful.datadir import tighten_data_dir
from wakeful.domain.models import App
from wakeful.node.registration import held_data_dir
from wakeful.store import open_store, sqlite_url
from wakeful.store.testing import free_port
from wakeful.testing import up_command

pytestmark = pytest.mark.anyio


def readable_by_others(root: Path) -> list[str]:
    """Everything under `root` (itself included) with any group or other permission."""
    found = []
    for path in [root, *root.rglob("*")]:
        try:
            info = path.lstat()
        except FileNotFoundError:  # a running wakeful's file, renamed since it was listed
            continue  # (`.control.json.new` becoming `.control.json`, CI25's flake)
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
            found.append(f"{path.relative_to(root.parent)} {stat.filemode(info.st_mode)}")
    return found


def test_wakeful_up_keeps_its_data_dir_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    data_dir.mkdir()  # as `wakeful up` finds a directory made by hand, or by an older
    data_dir.chmod(0o755)  # version: open to everyone
    leftover = data_dir / "notes.txt"
    leftover.write_text("from before")
    leftover.chmod(0o644)
    app = make_app(tmp_path)
    proxy, api, admin = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        up_command(data_dir, [app], proxy=proxy, api=api, admin=admin, idle_interval=60),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        status = 0
        deadline = time.monotonic() + 60  # a bound on a wait for the answer, not a pause
        while status != 200 and process.poll() is None and time.monotonic() < deadline:
            try:  # the first request wakes a sandbox: its tree and output.log appear
                answer = httpx.get(
                    f"http://127.0.0.1:{proxy}/", headers={"Host": "hello.localhost"}, timeout=30
                )
                status = answer.status_code
            except httpx.TransportError:
                time.sleep(0.1)
        assert status == 200
        made = {p.relative_to(data_dir).as_posix() for p in data_dir.rglob("*")}
        for name in ("store.db", "store.db-wal", "store.db-shm", "token", "control.json"):
            assert name in made, sorted(made)
        assert any(name.startswith("artifacts/") for name in made), sorted(made)
        assert any(name.endswith("/output.log") for name in made), sorted(made)
        assert any(name.endswith("/app/app.py") for name in made), sorted(made)
        assert readable_by_others(data_dir) == []
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert f"data directory {data_dir} was readable by other users" in output
    assert readable_by_others(data_dir) == [], output


def test_an_open_data_dir_is_tightened_and_that_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "state"
    (data_dir / "artifacts").mkdir(parents=True, mode=0o755)
    (data_dir / "sandboxes" / "sb-1").mkdir(parents=True, mode=0o755)
    for path, mode in [
        (data_dir, 0o755),
        (data_dir / "artifacts", 0o755),
        (data_dir / "sandboxes", 0o755),
    ]:
        path.chmod(mode)
    for name in ("store.db", "token", "artifacts/x.tar.gz", "sandboxes/sb-1/output.log"):
        (data_dir / name).write_text("secret")
        (data_dir / name).chmod(0o644)
    (data_dir / "run.sh").write_text("#!/bin/sh\n")
    (data_dir / "run.sh").chmod(0o755)
    tool = data_dir / "images" / "bases" / "base-1" / "usr" / "bin" / "tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (data_dir / "images").chmod(0o700)

    with caplog.at_level(logging.INFO, logger="wakeful.datadir"):
        changed = tighten_data_dir(data_dir)

    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "artifacts").stat().st_mode) == 0o700
    for name in ("store.db", "token", "artifacts/x.tar.gz"):
        assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((data_dir / "run.sh").stat().st_mode) == 0o700
    # Sandbox trees are the node's, made fresh per sandbox (and may be another uid's).
    assert stat.S_IMODE((data_dir / "sandboxes" / "sb-1").stat().st_mode) == 0o755
    assert stat.S_IMODE((data_dir / "sandboxes").stat().st_mode) == 0o755
    # The image cache's trees keep their images' modes (their apps need them).
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755
    assert stat.S_IMODE(tool.parent.stat().st_mode) == 0o755
    assert len(changed) == 6
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert f"data directory {data_dir} was readable by other users" in record.getMessage()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="wakeful.datadir"):
        assert tighten_data_dir(data_dir) == []
    assert caplog.records == []


def test_a_second_wakeful_up_on_a_held_data_dir_is_refused_before_it_changes_anything(
    tmp_path: Path,
) -> None:
    """Another `wakeful up` (or node agent) runs on the directory: this one says so, and
    leaves the other's files as they were (it once tightened them all first)."""
    data_dir = tmp_path / "state"
    data_dir.mkdir(mode=0o700)
    theirs = data_dir / "images" / "bases" / "base-1" / "tool"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("#!/bin/sh\n")
    theirs.chmod(0o755)
    notes = data_dir / "notes.txt"
    notes.write_text("theirs")
    notes.chmod(0o644)
    with held_data_dir(data_dir):
        done = subprocess.run(
            up_command(
                data_dir,
                [],
                proxy=free_port(),
                api=free_port(),
                admin=free_port(),
                idle_interval=60,
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "wakeful: error: another node agent (a `wakeful node`, or a `wakeful up`) runs on the "
        f"data directory {data_dir}: one agent a directory"
    )
    assert stat.S_IMODE(notes.stat().st_mode) == 0o644
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755
    assert sorted(p.name for p in data_dir.iterdir()) == [
        "agent.id",
        "agent.lock",
        "images",
        "notes.txt",
    ]


def test_a_fresh_data_dir_is_private_from_its_first_file_and_says_nothing(
    tmp_path: Path,
) -> None:
    """The lock's files are the first written: under the private umask already, so nothing
    needs tightening and no warning blames the operator for what wakeful just made."""
    data_dir = tmp_path / "fresh"
    process = subprocess.Popen(
        up_command(
            data_dir, [], proxy=free_port(), api=free_port(), admin=free_port(), idle_interval=60
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        said = []
        while line := process.stdout.readline():  # up to the line it prints once it serves
            said.append(line)
            if line.startswith("wakeful is up"):
                break
        assert readable_by_others(data_dir) == [], said
    finally:
        process.send_signal(signal.SIGTERM)
        output = "".join(said) + process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert "readable by other users" not in output


def test_an_empty_open_data_dir_is_tightened_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What `wakeful up` makes of a directory it was just given (nothing was exposed)."""
    data_dir = tmp_path / "fresh"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    with caplog.at_level(logging.INFO, logger="wakeful.datadir"):
        assert tighten_data_dir(data_dir) == [data_dir]
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert [r.levelno for r in caplog.records] == [logging.INFO]


async def test_the_sqlite_store_and_its_wal_and_shm_are_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "db" / "store.db")
    umask = os.umask(0o022)  # the usual one: files 0644 unless made otherwise
    try:
        async with open_store(url) as store:
            await store.put("apps/web", App(name="web"))
            files = sorted((tmp_path / "db").iterdir())
            assert [p.name for p in files] == ["store.db", "store.db-shm", "store.db-wal"]
            for path in files:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "db").stat().st_mode) == 0o700
