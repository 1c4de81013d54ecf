"""For tests: a `BlobSource` that serves the blobs of an OCI image layout on disk.

`DirectoryBlobs(path)` streams `path/blobs/sha256/<hex>` in small chunks, as the control plane
would, and records each digest it was asked for (`fetched`), so a test can tell a fetch from a
cache hit. A blob it does not have raises `ImageError`, as the real source does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from .blobs import hex_of
from .errors import ImageError


class DirectoryBlobs:
    def __init__(self, layout: Path, chunk_size: int = 64 << 10) -> None:
        self.layout = layout
        self.chunk_size = chunk_size
        self.fetched: list[str] = []

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        self.fetched.append(digest)
        path = anyio.Path(self.layout / "blobs" / "sha256" / hex_of(digest))
        try:
            file = await path.open("rb")
        except FileNotFoundError as exc:
            raise ImageError(f"blob {digest} is not in {self.layout}") from exc
        async with file:
            while chunk := await file.read(self.chunk_size):
                yield chunk
