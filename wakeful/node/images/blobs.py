"""An image's blobs on the node: fetched by digest, checked, kept in a local OCI layout.

Theory of operation. A blob is streamed from the `BlobSource` into a temporary file while it
is hashed, a few chunks at a time in a worker thread (never whole in memory, never hashed on
the event loop), and is refused past `max_bytes`. Only when its bytes hash to the digest that
names it is it renamed into `blobs/sha256/<hex>`: a blob in the layout is always the one its
name says, so a truncated or altered one is never seen by umoci. One fetch per digest runs at a
time; a second caller waits for it and finds the blob there.

The layout (`oci-layout`, `blobs/`, `index.json`) is what `umoci raw unpack --image
LAYOUT:REF` reads. `index.json` names the manifests whose blobs are all here (`name`,
`unname`), each by its hex, and is rewritten whole, under a lock and renamed into place, from
the set as it is when the lock is taken.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import IO, Protocol

import anyio

from .errors import ImageError

FLUSH_BYTES = 1 << 20
"""Chunks are written and hashed in batches of about this many bytes (one thread hop each)."""


class BlobSource(Protocol):
    """Where a node gets an image's blobs: the control plane, by digest."""

    def chunks(self, digest: str) -> AsyncIterator[bytes]:
        """The bytes of the blob `digest` (`sha256:<hex>`), in pieces. A blob the source does
        not have raises `ImageError` or `OSError` (the cache reports both as `ImageError`)."""
        ...


def hex_of(digest: str) -> str:
    return digest.removeprefix("sha256:")


class _Partial:
    """A blob being received: a temporary file and the hash of what was written to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sha = hashlib.sha256()
        self.size = 0
        self.file: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed by `finish`)

    def write(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.sha.update(piece)
            self.file.write(piece)

    def finish(self) -> None:
        self.file.close()  # a second time does nothing


class Layout:
    """The local OCI layout at `path`: blobs fetched from `source`, each at most `max_bytes`."""

    def __init__(self, path: Path, source: BlobSource, max_bytes: int) -> None:
        self.path = path
        self._source = source
        self._max_bytes = max_bytes
        self._fetching: dict[str, anyio.Lock] = {}
        self._index_lock = anyio.Lock()
        self._named: set[str] = set()
        self.sizes: dict[str, int] = {}
        """Every stored blob's size, by digest."""

    def prepare(self) -> None:
        """Make the layout empty (what a previous agent left is not trusted or accounted)."""
        shutil.rmtree(self.path, ignore_errors=True)
        (self.path / "blobs" / "sha256").mkdir(mode=0o700, parents=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        self._write_index([])

    def blob(self, digest: str) -> Path:
        return self.path / "blobs" / "sha256" / hex_of(digest)

    async def ensure(self, digest: str, size: int | None = None, limit: int | None = None) -> Path:
        """The blob `digest`, fetched unless it is here already, of at most `limit` bytes
        (by default `max_bytes`). `size`, when the record states it, is checked against the
        bound before a byte is fetched."""
        limit = self._max_bytes if limit is None else min(limit, self._max_bytes)
        if size is not None and size > limit:
            raise ImageError(
                f"blob {digest} is {size} bytes, more than the {limit} bytes "
                "this node takes for one blob"
            )
        lock = self._fetching.setdefault(digest, anyio.Lock())
        try:
            async with lock:
                target = self.blob(digest)
                if digest not in self.sizes:
                    self.sizes[digest] = await self._fetch(digest, target, limit)
                return target
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._fetching.pop(digest, None)

    async def _fetch(self, digest: str, target: Path, limit: int) -> int:
        temporary = target.with_name(f".partial-{hex_of(digest)}-{secrets.token_hex(4)}")
        partial = await anyio.to_thread.run_sync(_Partial, temporary)
        try:
            await self._receive(digest, partial, limit)
            await anyio.to_thread.run_sync(partial.finish)  # all of it written before the rename
            actual = f"sha256:{partial.sha.hexdigest()}"
            if actual != digest:
                raise ImageError(
                    f"blob {digest} does not match its digest: the {partial.size} bytes "
                    f"served hash to {actual}"
                )
            await anyio.to_thread.run_sync(os.replace, temporary, target)
            return partial.size
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_discard, partial, temporary)

    async def _receive(self, digest: str, partial: _Partial, limit: int) -> None:
        pieces: list[bytes] = []
        pending = 0
        chunks = self._source.chunks(digest)
        try:
            async for chunk in chunks:
                partial.size += len(chunk)
                if partial.size > limit:
                    raise ImageError(
                        f"blob {digest} is more than the {limit} bytes this node takes for one blob"
                    )
                pieces.append(chunk)
                pending += len(chunk)
                if pending >= FLUSH_BYTES:
                    await anyio.to_thread.run_sync(partial.write, pieces)
                    pieces, pending = [], 0
            await anyio.to_thread.run_sync(partial.write, pieces)
        except (OSError, ValueError) as exc:  # unavailable now, or refused (ArtifactError)
            raise ImageError(f"blob {digest} could not be fetched: {exc}") from exc
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()

    async def name(self, manifest: str) -> None:
        """Name `manifest` (by its hex) in `index.json`, for umoci; its blobs are all here."""
        if manifest not in self._named:
            self._named.add(manifest)
            await self._rewrite_index()

    async def unname(self, manifests: Iterable[str]) -> None:
        if self._named & set(manifests):
            self._named -= set(manifests)
            await self._rewrite_index()

    async def _rewrite_index(self) -> None:
        async with self._index_lock:
            await anyio.to_thread.run_sync(self._write_index, sorted(self._named))

    def _write_index(self, manifests: list[str]) -> None:
        entries = [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": self.sizes[digest],
                "annotations": {"org.opencontainers.image.ref.name": hex_of(digest)},
            }
            for digest in manifests
        ]
        text = json.dumps({"schemaVersion": 2, "manifests": entries})
        temporary = self.path / f".index-{secrets.token_hex(4)}.json"
        temporary.write_text(text)
        os.replace(temporary, self.path / "index.json")

    async def remove(self, digests: Iterable[str]) -> None:
        """Delete these blobs (none a named manifest needs). Forgotten and moved aside at
        once, on the loop (a rename each, microseconds), before anything awaits: a make of the
        same image that starts meanwhile fetches them again into their place, and the delete
        in a thread that follows can never take its fresh file."""
        gone = [digest for digest in digests if self.sizes.pop(digest, None) is not None]
        aside = []
        for digest in gone:
            moved = self.path / f".gone-{hex_of(digest)}-{secrets.token_hex(4)}"
            try:
                os.replace(self.blob(digest), moved)  # on the loop: see above
            except FileNotFoundError:
                continue
            aside.append(moved)
        await anyio.to_thread.run_sync(_unlink, aside)


def _unlink(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _discard(partial: _Partial, temporary: Path) -> None:
    partial.finish()
    temporary.unlink(missing_ok=True)
