"""A sandbox's app files: the version's artifact, unpacked where the sandbox will see them.

The artifact's bytes are checked against its sha256 before anything is unpacked, whichever
`Artifacts` served them (the control plane's own files in `wakeful up`, or the control API):
a file changed on disk or in transit is refused with an `ArtifactError` naming the digest, and
the sandbox goes dead with that reason. The unpacked tree is private to its owner (files keep
only their owner's bits, directories are 0700), like everything else in the data directory.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from wakeful.aio.packing import unpack
from wakeful.domain.artifacts import ArtifactError, digest_of
from wakeful.node.jail.tmpfs import unmount_under


class Artifacts(Protocol):
    """Where a node gets a version's packed app directory, and a stateful app's archive, by
    its sha256 (archives are stored through the node's `state.hold.Keeper`)."""

    async def fetch(self, digest: str) -> bytes: ...


def sandbox_dir(data_dir: Path, sandbox_id: str) -> Path:
    """Where a sandbox lives on its node: `app/` (the unpacked artifact) and `output.log`."""
    return data_dir / "sandboxes" / sandbox_id


def remove_sandbox_dir(data_dir: Path, sandbox_id: str) -> None:
    shutil.rmtree(sandbox_dir(data_dir, sandbox_id), ignore_errors=True)


@dataclass(frozen=True)
class StateLayer:
    """A stateful app's state, placed at `path` in its tree over the artifact's files:
    `data` is its latest archive (None: never archived, the artifact's files are the state)."""

    path: str
    data: bytes | None = None
    digest: str | None = None
    checked: bool = False
    """`data` was checked against `digest` already (by `StateHold.claim`, which must know
    before the start whether to refuse it): not hashed a second time on the start path."""


@dataclass(frozen=True)
class Packed:
    """A version's artifact as fetched (`data` None for an app without files), and a stateful
    app's state. Whoever places the app's files unpacks it (`Runtime.start`: straight into the
    sandbox's own tmpfs when it has one, so a start writes the files once), checking each
    archive against its digest first."""

    data: bytes | None
    digest: str | None
    state: StateLayer | None = None

    def unpack_into(self, path: Path, owner: int | None = None) -> None:
        """Into the empty directory `path`, private to its owner (only the owner's permission
        bits; `owner`'s, uid and gid, when given); nothing is written unless the bytes are the
        archives their digests name."""
        if self.data is not None and self.digest is not None:
            verify(self.data, self.digest)
        state = self.state
        if (
            state is not None
            and not state.checked
            and state.data is not None
            and state.digest is not None
        ):
            verify(state.data, state.digest)
        if self.data is not None:
            unpack(self.data, path, owner=owner)
        else:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if state is not None:
            target = path / state.path
            if state.data is not None:  # the archive replaces what the artifact had there
                shutil.rmtree(target, ignore_errors=True)
                unpack(state.data, target, owner=owner)
            _make_dirs(path, state.path, owner)


def _make_dirs(root: Path, relative: str, owner: int | None) -> None:
    """`root/relative` and the directories above it, each 0700 and `owner`'s when given."""
    current = root
    for part in relative.split("/"):
        current = current / part
        current.mkdir(mode=0o700, exist_ok=True)
        if owner is not None:  # made by the unpack too, as root: the app writes here
            os.chown(current, owner, owner)


async def fetch_packed(
    artifacts: Artifacts, digest: str | None, state: StateLayer | None = None
) -> Packed | None:
    """The version's artifact and the app's state (None for a version without files or
    state), not yet checked."""
    if digest is None and state is None:
        return None
    return Packed(None if digest is None else await artifacts.fetch(digest), digest, state)


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
