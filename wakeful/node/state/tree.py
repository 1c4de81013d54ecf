"""What a sandbox's tree holds of its app's state: the state directory at the app's `[state]`
path (never through a symbolic link: the app owns its tree), and the mark that the state was
restored there (`RESTORED`), which a restarted agent salvages a tree by.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from wakeful.domain.artifacts import ArtifactError
from wakeful.domain.models import StateSpec

RESTORED = "restored"
"""The mark beside a sandbox's tree (in its directory, out of the app's reach) that its state
was restored and the app started: only such a tree holds state worth archiving."""


def mark_restored(base: Path, path: str) -> None:
    """Durably, in the sandbox's directory `base`, with the state's `path` in its tree (what a
    restarted agent packs, whether or not the sandbox's record is still there)."""
    fd = os.open(base / RESTORED, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, path.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def restored_path(base: Path) -> str | None:
    """The state path `mark_restored` wrote in `base`, None when there is no valid mark."""
    try:
        path = (base / RESTORED).read_text()
        return StateSpec(path=path).path
    except (OSError, ValueError):
        return None


def state_source(tree: Path, path: str) -> Path:
    """`tree/path`, refused (`ArtifactError`) when any part of it is a symbolic link (the app
    owns its tree and could point its state at any host path the agent can read) or not a
    directory. A missing one is an empty state: the app removed it."""
    current = tree
    for part in path.split("/"):
        current = current / part
        try:
            found = current.lstat()
        except FileNotFoundError:
            return tree / path  # nothing there: an empty state
        if stat.S_ISLNK(found.st_mode):
            raise ArtifactError(f"its state path {path!r} is a symbolic link: not archived")
        if not stat.S_ISDIR(found.st_mode):
            raise ArtifactError(f"its state path {path!r} is not a directory: not archived")
    return current


def left_tree(base: Path) -> Path | None:
    """A previous run's app tree in the sandbox directory `base`: in its tmpfs (isolated as
    root) or its working directory."""
    for tree in (base / "fs" / "app", base / "app"):
        if tree.is_dir() and not tree.is_symlink():
            return tree
    return None
