from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.images import OciLayout
from wakeful.node.images import ImageCache
from wakeful.node.images.testing import DirectoryBlobs

MiB = 1 << 20

CacheFor = Callable[..., tuple[ImageCache, DirectoryBlobs]]


@pytest.fixture
def layout(tmp_path: Path) -> OciLayout:
    """An empty OCI layout, the source of the fake control plane's blobs."""
    return OciLayout(tmp_path / "source")


@pytest.fixture
def cache_for(tmp_path: Path) -> CacheFor:
    """A cache under `tmp_path/cache` over a layout's blobs; bounds as a test gives them
    (by default roomy: 64 MiB a blob, 256 MiB and 10,000 files an image, 1 GiB in all)."""

    def make(
        layout: OciLayout,
        *,
        max_bytes: int = 64 * MiB,
        max_unpacked: int = 256 * MiB,
        max_files: int = 10_000,
        max_cache_bytes: int = 1024 * MiB,
    ) -> tuple[ImageCache, DirectoryBlobs]:
        blobs = DirectoryBlobs(layout.path)
        cache = ImageCache(
            tmp_path / "cache",
            blobs,
            max_bytes=max_bytes,
            max_unpacked=max_unpacked,
            max_files=max_files,
            max_cache_bytes=max_cache_bytes,
        )
        return cache, blobs

    return make
