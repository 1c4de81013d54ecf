"""Packed app directories, stored by content: the same directory always packs to the same bytes.

A pack is a gzip'd tar of the directory's regular files (no links, devices, or the usual build
litter), with fixed owners and times, so its sha256 names its content. Unpacking refuses any
member that would land outside the destination.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import anyio

MAX_ARTIFACT_BYTES = 100 * 1024 * 1024
SKIP_DIRS = frozenset({".git", "__pycache__", ".wakeful", ".venv", "node_modules", ".mypy_cache"})


class ArtifactError(ValueError):
    pass


class ArtifactStorageError(OSError):
    """The artifact directory cannot take a write now (a full disk, an I/O error): the
    upload can be retried later; nothing was stored."""


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(directory: Path) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(files):
                path = Path(root) / name
                if path.is_symlink() or not path.is_file():
                    continue
                info = tarfile.TarInfo(path.relative_to(directory).as_posix())
                info.size = path.stat().st_size
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
    packed = gzip.compress(raw.getvalue(), mtime=0)
    if len(packed) > MAX_ARTIFACT_BYTES:
        raise ArtifactError(
            f"{directory} packs to {len(packed)} bytes; the bound is {MAX_ARTIFACT_BYTES}"
        )
    return packed


def unpack(data: bytes, destination: Path) -> None:
    destination = destination.resolve()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                target = (destination / member.name).resolve()
                if not member.isfile() or not target.is_relative_to(destination):
                    raise ArtifactError(f"refusing artifact member {member.name!r}")
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4; Debian 12 has 3.11.2
                tar.extractall(destination, filter="data")
            else:  # every member was checked above: regular files inside the destination
                tar.extractall(destination)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, OSError) as exc:
        raise ArtifactError(f"corrupt artifact: {exc}") from exc


class LocalArtifacts:
    """Artifacts in a directory, named by their sha256 (the control plane's copy)."""

    def __init__(self, directory: Path, max_bytes: int = MAX_ARTIFACT_BYTES) -> None:
        self._dir = directory
        self.max_bytes = max_bytes

    async def put(self, data: bytes, expected: str | None = None) -> str:
        digest = digest_of(data)
        if expected is not None and expected != digest:
            raise ArtifactError(f"upload's sha256 is {digest}, not {expected}")
        if len(data) > self.max_bytes:
            raise ArtifactError(f"artifact is {len(data)} bytes; the bound is {self.max_bytes}")
        await anyio.to_thread.run_sync(_validate, data)
        path = self._dir / f"{digest}.tar.gz"
        if not path.exists():
            partial = path.with_suffix(".part")
            try:
                self._dir.mkdir(parents=True, exist_ok=True)
                await anyio.Path(partial).write_bytes(data)
                partial.replace(path)
            except OSError as exc:
                partial.unlink(missing_ok=True)
                raise ArtifactStorageError(
                    exc.errno, f"cannot store artifact {digest}: {exc.strerror}"
                ) from exc
        return digest

    async def fetch(self, digest: str) -> bytes:
        path = self._dir / f"{digest}.tar.gz"
        if not path.exists():
            raise ArtifactError(f"no artifact {digest}")
        return await anyio.Path(path).read_bytes()

    def has(self, digest: str) -> bool:
        return (self._dir / f"{digest}.tar.gz").exists()

    async def remove(self, digest: str) -> bool:
        """Delete a stored artifact; False if there was none."""
        try:
            await anyio.Path(self._dir / f"{digest}.tar.gz").unlink()
        except FileNotFoundError:
            return False
        return True


def _validate(data: bytes) -> None:
    """A corrupt upload is refused before it is stored."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                if (
                    not member.isfile()
                    or member.name.startswith("/")
                    or ".." in member.name.split("/")
                ):
                    raise ArtifactError(f"refusing artifact member {member.name!r}")
    except (tarfile.TarError, EOFError, gzip.BadGzipFile) as exc:
        raise ArtifactError(f"corrupt artifact: {exc}") from exc
