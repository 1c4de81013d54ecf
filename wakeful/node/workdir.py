"""A sandbox's app files: the version's artifact, unpacked where the sandbox will see them.

The artifact's bytes are checked against its sha256 before anything is unpacked, whichever
`Artifacts` served them (the control plane's own files in `wakeful up`, or the control API):
a file changed on disk or in transit is refused with an `ArtifactError` naming the digest, and
the sandbox goes dead with that reason. The unpacked tree is private to its owner (files keep
only their owner's bits, directories are 0700), like everything else in the data directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from wakeful.domain.artifacts import ArtifactError, digest_of, unpack

from .hardening import unmount_under


class Artifacts(Protocol):
    """Where a node gets a version's packed app directory, by its sha256."""

    async def fetch(self, digest: str) -> bytes: ...


def sandbox_dir(data_dir: Path, sandbox_id: str) -> Path:
    """Where a sandbox lives on its node: `app/` (the unpacked artifact) and `output.log`."""
    return data_dir / "sandboxes" / sandbox_id


def remove_sandbox_dir(data_dir: Path, sandbox_id: str) -> None:
    shutil.rmtree(sandbox_dir(data_dir, sandbox_id), ignore_errors=True)


@dataclass(frozen=True)
class Packed:
    """A version's artifact as fetched. Whoever places the app's files unpacks it
    (`Runtime.start`: straight into the sandbox's own tmpfs when it has one, so a start
    writes the files once), checking it against its digest first."""

    data: bytes
    digest: str

    def unpack_into(self, path: Path, owner: int | None = None) -> None:
        """Into the empty directory `path`, private to its owner (only the owner's permission
        bits; `owner`'s, uid and gid, when given); nothing is written unless the bytes are the
        artifact `digest` names."""
        verify(self.data, self.digest)
        unpack(self.data, path, owner=owner)


async def fetch_packed(artifacts: Artifacts, digest: str | None) -> Packed | None:
    """The version's artifact (None for a version without one), not yet checked."""
    return None if digest is None else Packed(await artifacts.fetch(digest), digest)


def fill_workdir(path: Path, packed: Packed | None) -> None:
    """A fresh directory `path`, holding the app `packed` when given."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)
    if packed is not None:
        packed.unpack_into(path)


def verify(data: bytes, digest: str) -> None:
    """Refuse bytes that are not the artifact `digest` names."""
    actual = digest_of(data)
    if actual != digest:
        raise ArtifactError(
            f"artifact {digest} does not match its sha256 (the bytes served hash to "
            f"{actual}): refusing to unpack it"
        )


def clear_sandboxes(data_dir: Path) -> None:
    """Remove every sandbox directory under `data_dir`, unmounting what a crashed agent left
    mounted there first (an isolated sandbox's tmpfs). Only when none of ours runs."""
    root = sandbox_dir(data_dir, "x").parent
    unmount_under(root)
    shutil.rmtree(root, ignore_errors=True)
