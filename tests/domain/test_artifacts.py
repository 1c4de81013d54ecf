"""The packed-app format's bounds: a compression bomb is refused on upload and on unpack, before
a byte of it is written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from wakeful.domain import artifacts
from wakeful.domain.artifacts import ArtifactError, unpack, validate


def bomb(size: int) -> bytes:
    """One file of `size` zero bytes: gzip packs a GiB of zeros into about a MiB."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(b"\0" * size))
    return out.getvalue()


def test_an_artifact_that_expands_past_the_bound_is_refused_whole(tmp_path: Path) -> None:
    assert artifacts.MAX_UNPACKED_BYTES == 2 << 30  # the default both take; tested smaller here
    packed = bomb(4 << 20)
    assert len(packed) < 64 << 10  # small on the wire
    with pytest.raises(ArtifactError, match="unpacks to 4194304 bytes"):
        validate(packed, max_bytes=1 << 20)
    with pytest.raises(ArtifactError, match="the bounds are 1048576 bytes"):
        unpack(packed, tmp_path / "app", max_bytes=1 << 20)
    assert not (tmp_path / "app" / "zeros.bin").exists()
    unpack(bomb(1 << 20), tmp_path / "ok", max_bytes=1 << 20)  # at the bound: fine
    assert (tmp_path / "ok" / "zeros.bin").stat().st_size == 1 << 20
