"""This node's copies of its states' archives, and what could not be handed on.

An archive is written to `<data dir>/states/APP.EPOCH.tar.gz` (a temporary file, fsync'd,
renamed into place) before it is stored with the control plane, and deleted once the state is
released with it. What cannot be handed on (an archive refused for good, a directory that
could not be archived, an archive of a state this node lost) goes to `<data dir>/kept-states/`,
for recovery by hand: the agent never cleans it. Which leftover archive goes where is
`stale_fate` (pure).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import shutil
import stat
from collections.abc import Collection
from pathlib import Path

from wakeful.aio.packing import pack

log = logging.getLogger(__name__)
SET_ASIDE_FACTOR = 4
"""A state too large to archive is copied aside only up to this many times the bound."""


class Fate(enum.Enum):
    """What becomes of a file in `states/` that no runner of this run is handing back."""

    KEEP = "keep"
    """The archive of a state this node holds (or a runner has in hand): `settle` hands it on."""
    DELETE = "delete"
    """A partial write (a crash mid-save), or an archive this node released (killed before it
    deleted it): of no use."""
    SET_ASIDE = "set aside"
    """An archive of a state this node no longer holds that it did not release (taken back, or
    given up on by an operator): maybe the only copy of the app's last writes."""


def stale_fate(
    entry: str, held_here: Collection[str], in_hand: Collection[str], released: Collection[str]
) -> Fate:
    """`entry`: a file name in `states/`; `held_here`: the archive names of the states this
    node holds; `in_hand`: those a runner of this run holds, whatever the listing said;
    `released`: the archive names each state record was last released with."""
    name = entry.removesuffix(".part")
    if name in held_here or name in in_hand:
        return Fate.KEEP
    if entry.endswith(".part") or entry in released:
        return Fate.DELETE
    return Fate.SET_ASIDE


class LocalArchives:
    """`states/` and `kept-states/` under a node's data directory; archives of at most
    `max_bytes`. Blocking: callers on the event loop run these in a thread."""

    def __init__(self, data_dir: Path, max_bytes: int) -> None:
        self.dir = data_dir / "states"
        self.kept = data_dir / "kept-states"
        """What could not be handed on, for recovery by hand (never cleaned by the agent)."""
        self.max_bytes = max_bytes

    def path(self, app: str, epoch: int) -> Path:
        return self.dir / f"{app}.{epoch}.tar.gz"

    def pack(self, source: Path) -> bytes:
        return pack(source, skip=frozenset(), max_bytes=self.max_bytes)

    def save(self, app: str, epoch: int, data: bytes) -> Path:
        """Durably on this node: a temporary file, fsync'd, renamed into place, the directory
        fsync'd."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.path(app, epoch)
        partial = path.with_name(path.name + ".part")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        partial.replace(path)
        directory = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return path

    def set_aside(self, source: Path, app: str, epoch: int) -> str | None:
        """A state directory that could not be archived, copied where it outlives its sandbox
        (links copied as links, never followed): where, or None when there is nothing to copy
        or it is too large to (a sparse file, say, would be written out whole: past
        `SET_ASIDE_FACTOR` times the archive bound it is not copied at all)."""
        target = self.kept / f"{app}.{epoch}"
        budget = SET_ASIDE_FACTOR * self.max_bytes
        try:
            if not source.is_dir() or source.is_symlink() or _size(source) > budget:
                return None
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, symlinks=True)
        except OSError as exc:
            log.error("could not keep a copy of %s: %.300s", source, exc)
            shutil.rmtree(target, ignore_errors=True)
            return None
        return str(target)

    def move_aside(self, local: Path) -> Path:
        """Move an archive in `states/` to `kept-states/`; where it went."""
        aside = self.kept / local.name
        _move(local, aside)
        return aside

    def forget_stale(
        self, held_here: Collection[str], released: Collection[str], in_hand: Collection[str]
    ) -> None:
        """Each file in `states/` deleted or set aside as `stale_fate` says."""
        with contextlib.suppress(OSError):
            for entry in self.dir.iterdir():
                fate = stale_fate(entry.name, held_here, in_hand, released)
                if fate is Fate.DELETE:
                    entry.unlink(missing_ok=True)
                elif fate is Fate.SET_ASIDE:
                    _move(entry, self.kept / entry.name)


def _size(directory: Path) -> int:
    """The bytes of the regular files under `directory` (their length, not their blocks: a
    copy writes the length)."""
    total = 0
    for root, _, files, root_fd in os.fwalk(directory):
        del root
        for name in files:
            found = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            if stat.S_ISREG(found.st_mode):
                total += found.st_size
    return total


def _move(source: Path, target: Path) -> None:
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    source.replace(target)
