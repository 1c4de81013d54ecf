"""The control plane's artifact store: packed app directories in a directory, named by their
sha256 (the format itself is `wakeful.domain.artifacts`).

Files are private (0600 in a 0700 directory) and each one's mtime is set, on the store's own
clock, when it was last uploaded or claimed by a deploy (`keep`): the collector
(`deploy/collect.py`) deletes an artifact no version references only once that time is more
than a grace period ago. Touching and deleting happen under one lock, so a deploy that claimed
an artifact never finds it deleted between its claim and its version record.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from wakeful.aio.packing import validate
from wakeful.domain.artifacts import (
    MAX_ARTIFACT_BYTES,
    MAX_UNPACKED_BYTES,
    ArtifactError,
    ArtifactUnavailable,
    digest_of,
)

SUFFIX = ".tar.gz"
PARTIAL = ".part"
_NAME = re.compile(r"^([0-9a-f]{64})\.tar\.gz$")


class ArtifactStorageError(ArtifactUnavailable):
    """The artifact directory cannot take a write now (a full disk, an I/O error): the
    upload can be retried later; nothing was stored."""


class LocalArtifacts:
    """Artifacts in a directory, named by their sha256 (the control plane's copy).

    `clock`: wall-clock seconds, written as each file's mtime when it is uploaded or claimed
    (tests pass a `ManualClock`)."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int = MAX_ARTIFACT_BYTES,
        *,
        state_max_bytes: int = 256 << 20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._dir = directory
        self.max_bytes = max_bytes
        self.state_max_bytes = state_max_bytes
        """The bound on a stateful app's archive (stored here too, by `deploy.states`)."""
        self._clock = clock
        self._lock = anyio.Lock()

    def _path(self, digest: str) -> Path:
        return self._dir / f"{digest}{SUFFIX}"

    async def put(
        self,
        data: bytes,
        expected: str | None = None,
        limit: int | None = None,
        *,
        refresh: bool = True,
    ) -> str:
        """Store `data` (or, when it is stored already and `refresh`, start its grace period
        again: an upload whose version is not written yet must not be collected). `limit`: the
        bound, `max_bytes` when None."""
        digest = await anyio.to_thread.run_sync(digest_of, data)  # up to hundreds of MB
        if expected is not None and expected != digest:
            raise ArtifactError(f"upload's sha256 is {digest}, not {expected}")
        limit = self.max_bytes if limit is None else limit
        if len(data) > limit:
            raise ArtifactError(f"archive is {len(data)} bytes; the bound is {limit}")
        # What it may unpack to: a state archive no more than its bound (it was packed from
        # that much), an artifact the artifact bound.
        unpacked = MAX_UNPACKED_BYTES if limit == self.max_bytes else limit
        await anyio.to_thread.run_sync(validate, data, unpacked)
        async with self._lock:
            await anyio.to_thread.run_sync(self._write, digest, data, self._clock(), refresh)
        return digest

    def _write(self, digest: str, data: bytes, now: float, refresh: bool) -> None:
        path = self._path(digest)
        partial = None
        try:
            if not refresh and path.exists():
                return
            try:
                os.utime(path, (now, now))
                return
            except FileNotFoundError:
                pass
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self._dir, prefix=f"{digest}.", suffix=PARTIAL)
            partial = Path(name)  # mkstemp creates it 0600
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.utime(partial, (now, now))
            partial.replace(path)
        except OSError as exc:
            if partial is not None:
                partial.unlink(missing_ok=True)
            raise ArtifactStorageError(
                exc.errno, f"cannot store artifact {digest}: {exc.strerror}"
            ) from exc

    async def fetch(self, digest: str) -> bytes:
        """The stored bytes, as they are on disk: whoever unpacks them checks their sha256
        (`wakeful.node.sandbox.workdir`)."""
        path = self._path(digest)
        if not path.exists():
            raise ArtifactError(f"no artifact {digest}")
        return await anyio.Path(path).read_bytes()

    def has(self, digest: str) -> bool:
        return self._path(digest).exists()

    async def keep(self, digest: str) -> bool:
        """Claim a stored artifact for a version about to be written: its grace period
        starts again. False if it is not stored (never uploaded, or collected)."""
        async with self._lock:
            try:
                now = self._clock()
                os.utime(self._path(digest), (now, now))
            except FileNotFoundError:
                return False
            except OSError:  # cannot touch it (a read-only disk): it is there all the same
                return self.has(digest)
        return True

    async def stored(self) -> list[tuple[str, float]]:
        """Every stored artifact's digest, with when it was last uploaded or claimed."""

        def scan() -> list[tuple[str, float]]:
            found = []
            with contextlib.suppress(FileNotFoundError), os.scandir(self._dir) as entries:
                for entry in entries:
                    match = _NAME.match(entry.name)
                    if match is not None:
                        with contextlib.suppress(FileNotFoundError):
                            found.append((match.group(1), entry.stat().st_mtime))
            return sorted(found)

        return await anyio.to_thread.run_sync(scan)

    async def remove_idle(self, digest: str, before: float) -> bool:
        """Delete an artifact last uploaded or claimed before `before`; False if it was
        touched since (or is gone). The caller has checked that no version references it."""
        async with self._lock:
            path = self._path(digest)
            try:
                if path.stat().st_mtime >= before:
                    return False
                path.unlink()
            except FileNotFoundError:
                return False
        return True

    async def remove_partials(self) -> int:
        """Delete half-written uploads a crash left behind (every upload in progress holds
        the lock, so under it none is live)."""

        def sweep() -> int:
            removed = 0
            for path in self._dir.glob(f"*{PARTIAL}"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
            return removed

        async with self._lock:
            return await anyio.to_thread.run_sync(sweep)
