"""Packing and unpacking artifacts (`wakeful.aio.packing`): a compression bomb is refused on
upload and on unpack, before a byte of it is written; unpacked files keep only their owner's
bits."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from wakeful.aio.packing import unpack, validate
from wakeful.domain import artifacts
from wakeful.domain.artifacts import ArtifactError


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


def tar_of(*members: tuple[str, bytes, int]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another uid needs root")
def test_unpacked_files_keep_only_their_owners_bits_and_take_the_owner(tmp_path: Path) -> None:
    packed = tar_of(("run.sh", b"#!/bin/sh\n", 0o755), ("lib/deep/data.txt", b"x", 0o666))
    owner = 54321
    unpack(packed, tmp_path / "app", owner=owner)
    run, data = tmp_path / "app" / "run.sh", tmp_path / "app" / "lib" / "deep" / "data.txt"
    assert (run.read_bytes(), data.read_bytes()) == (b"#!/bin/sh\n", b"x")
    assert (run.stat().st_mode & 0o777, data.stat().st_mode & 0o777) == (0o700, 0o600)
    for path in (run, data, data.parent, data.parent.parent):
        assert (path.stat().st_uid, path.stat().st_gid) == (owner, owner), path
    assert data.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("members", "error"),
    [
        ((("a.txt", b"1", 0o644), ("a.txt", b"2", 0o644)), "in it twice"),
        ((("ok.txt", b"1", 0o644), ("../out.txt", b"2", 0o644)), "refusing artifact member"),
    ],
    ids=["a name given twice", "a member outside the destination"],
)
def test_a_bad_member_is_refused(
    members: tuple[tuple[str, bytes, int], ...], error: str, tmp_path: Path
) -> None:
    with pytest.raises(ArtifactError, match=error):
        unpack(tar_of(*members), tmp_path / "app")
    assert not (tmp_path / "out.txt").exists()


def gzipped(*blocks: bytes) -> bytes:
    """Raw tar blocks, gzip'd, with nothing checked: what a hostile uploader sends."""
    return gzip.compress(b"".join(blocks), compresslevel=1)


def header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


GARBAGE = header("././@PaxHeader", 1 << 32, tarfile.XHDTYPE)
"""A header no archive within its bounds reaches: reading as far as it is reading too far."""


@pytest.mark.parametrize(
    ("blocks", "refusal"),
    [
        pytest.param(
            [header("a", 0)] * (artifacts.MAX_MEMBERS + 1) + [GARBAGE],
            "in 100001 files",
            id="a million empty headers: refused at the 100,001st, never read to the end",
        ),
        pytest.param(
            [header("big", 2 << 20), b"\0" * tarfile.BLOCKSIZE, GARBAGE],
            "unpacks to 2097152 bytes",
            id="a member claiming more than the bound: refused before its data is inflated",
        ),
        pytest.param(
            [header("././@PaxHeader", 1 << 30, tarfile.XHDTYPE), b"\0" * tarfile.BLOCKSIZE],
            "a read of 1073741824 bytes",
            id="a pax header claiming a GiB: never read into memory",
        ),
        pytest.param(
            [header("././@LongLink", 64 << 20, tarfile.GNUTYPE_LONGNAME), b"\0" * 1024],
            "a read of 67108864 bytes",
            id="a GNU long name of 64 MiB: never read into memory",
        ),
    ],
)
def test_a_hostile_archive_is_refused_by_its_headers(
    tmp_path: Path, blocks: list[bytes], refusal: str
) -> None:
    """The hostile review stored 1M empty headers (485 MB of memory, 69 s) and one member
    inflating 4 GiB (17 s of CPU) before either was refused. Each header is checked against
    the bounds before the next is read, and no header is read whole past `MAX_READ`."""
    data = gzipped(*blocks)
    with pytest.raises(ArtifactError, match=refusal):
        validate(data, max_bytes=1 << 20)
    with pytest.raises(ArtifactError, match=refusal):
        unpack(data, tmp_path / "app", max_bytes=1 << 20)
    assert not (tmp_path / "app").exists() or not any((tmp_path / "app").iterdir())
