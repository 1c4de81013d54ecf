"""A sandbox's working directory: the version's artifact unpacked into a fresh directory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

import anyio

from wakeful.domain.artifacts import unpack


class Artifacts(Protocol):
    """Where a node gets a version's packed app directory, by its sha256."""

    async def fetch(self, digest: str) -> bytes: ...


def sandbox_dir(data_dir: Path, sandbox_id: str) -> Path:
    """Where a sandbox lives on its node: `app/` (the unpacked artifact) and `output.log`."""
    return data_dir / "sandboxes" / sandbox_id


def remove_sandbox_dir(data_dir: Path, sandbox_id: str) -> None:
    shutil.rmtree(sandbox_dir(data_dir, sandbox_id), ignore_errors=True)


async def prepare_workdir(path: Path, artifacts: Artifacts, digest: str | None) -> Path:
    await anyio.to_thread.run_sync(_fresh, path)
    if digest is not None:
        data = await artifacts.fetch(digest)
        await anyio.to_thread.run_sync(unpack, data, path)
    return path


def _fresh(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
