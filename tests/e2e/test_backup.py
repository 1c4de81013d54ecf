"""`wakeful backup` and `wakeful restore` (issue 13) with `wakeful up`: a data directory's
store and artifacts into a file, then into a new data directory, whose `wakeful up` serves
the same app without a deploy. And the schema version: `wakeful up` refuses a store a newer
wakeful wrote, naming both versions, and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.up import make_app, start_up, stop_up
from wakeful.store import open_store, sqlite_url
from wakeful.store.backup import SCHEMA_KEY, SCHEMA_VERSION, Schema

WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


def wakeful(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_backup_restored_into_a_new_data_directory_serves_the_same_app(
    tmp_path: Path,
) -> None:
    first = start_up(tmp_path / "a", make_app(tmp_path))
    try:
        answer = httpx.get(f"{first.proxy}/", headers=first.host(), timeout=60)
        assert answer.status_code == 200, answer.text
        saved = wakeful("--data-dir", str(first.data_dir), "backup", str(tmp_path / "b.jsonl"))
        assert saved.returncode == 0, saved.stderr
        assert "1 artifacts" in saved.stdout
    finally:
        stop_up(first)

    restored_dir = tmp_path / "b" / "state"
    again = wakeful("--data-dir", str(restored_dir), "restore", str(tmp_path / "b.jsonl"))
    assert again.returncode == 0, again.stderr
    twice = wakeful("--data-dir", str(restored_dir), "restore", str(tmp_path / "b.jsonl"))
    assert twice.returncode == 1, twice.stderr  # nothing written over it, and one line says so
    assert twice.stderr.startswith("wakeful: error: restore: the store is not empty ("), (
        twice.stderr
    )
    assert "Traceback" not in twice.stderr

    second = start_up(tmp_path / "b")  # no app directory: the app comes from the backup
    try:
        answer = httpx.get(f"{second.proxy}/", headers=second.host(), timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.text.startswith("hello from")
    finally:
        stop_up(second)


@pytest.mark.anyio
async def test_a_store_written_by_a_newer_wakeful_is_refused_by_name(tmp_path: Path) -> None:
    # On the session's loop (tests/conftest.py): anyio.run would find it running already.
    up = start_up(tmp_path, make_app(tmp_path))
    stop_up(up)
    async with open_store(sqlite_url(up.data_dir / "store.db")) as store:
        await store.put(SCHEMA_KEY, Schema(version=SCHEMA_VERSION + 1))
    with anyio.fail_after(60):
        refused = await anyio.run_process(
            [*WAKEFUL, "--data-dir", str(up.data_dir), "up"], check=False
        )
    assert refused.returncode == 1
    stderr = refused.stderr.decode()
    assert f"schema {SCHEMA_VERSION + 1}" in stderr
    assert "newer wakeful" in stderr
