"""The control plane's artifact store: packed app directories in a directory, named by their
sha256 (the format itself is `wakeful.domain.artifacts`)."""

from __future__ import annotations

from pathlib import Path

import anyio

from wakeful.domain.artifacts import MAX_ARTIFACT_BYTES, ArtifactError, digest_of, validate


class ArtifactStorageError(OSError):
    """The artifact directory cannot take a write now (a full disk, an I/O error): the
    upload can be retried later; nothing was stored."""


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
        await anyio.to_thread.run_sync(validate, data)
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
