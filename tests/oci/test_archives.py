"""Image archives are read by wakeful, never unpacked by skopeo (`wakeful.oci.archives`): a
hostile archive is refused naming its member, and writes nothing outside the fresh layout it
is read into (skopeo 1.9 followed an archive's links as root: found by attacking it)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from wakeful.oci import ImageRefused
from wakeful.oci.archives import open_archive


def member(tar: tarfile.TarFile, name: str, data: bytes = b"", **fields: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def archive(path: Path, build: object, *, compress: bool = False) -> Path:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)  # type: ignore[operator]
    data = gzip.compress(out.getvalue(), 1) if compress else out.getvalue()
    path.write_bytes(data)
    return path


def test_a_link_then_a_member_through_it_is_refused_and_writes_nothing_outside(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file.txt").write_text("untouched")

    def build(tar: tarfile.TarFile) -> None:
        member(tar, "x", type=tarfile.SYMTYPE, linkname=str(victim))
        member(tar, "x/file.txt", b"overwritten")
        member(tar, "x/dropped.sh", b"#!/bin/sh\n", mode=0o4755)

    path = archive(tmp_path / "evil.tar", build)
    with pytest.raises(ImageRefused, match='member "x" is not a regular file'):
        open_archive(path, "oci-archive", tmp_path / "work", 1 << 30)
    assert (victim / "file.txt").read_text() == "untouched"
    assert sorted(p.name for p in victim.iterdir()) == ["file.txt"]
    assert list((tmp_path / "work").iterdir()) == []  # the fresh layout went too


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda tar: member(tar, "etc/passwd", b"x"), "is not part of an OCI layout"),
        (lambda tar: member(tar, "../up", b"x"), "leaves it"),
        (lambda tar: member(tar, "blobs/sha256/" + "0" * 64, b"x"), "hashes to sha256:"),
        (
            lambda tar: member(tar, "holes", type=tarfile.GNUTYPE_SPARSE),
            "is not a regular file",
        ),
        (lambda tar: member(tar, "oci-layout", b"{}"), "has no index.json"),
    ],
    ids=["stray file", "dotdot", "wrong digest", "sparse", "no index"],
)
def test_what_an_oci_archive_may_not_hold(tmp_path: Path, build: object, reason: str) -> None:
    path = archive(tmp_path / "a.tar", build)
    with pytest.raises(ImageRefused, match=reason):
        open_archive(path, "oci-archive", tmp_path / "work", 1 << 30)


def test_a_compressed_archive_that_inflates_past_the_bound_is_refused(tmp_path: Path) -> None:
    def build(tar: tarfile.TarFile) -> None:
        member(tar, "manifest.json", b"[]")
        member(tar, "big.tar", b"\0" * (8 << 20))

    path = archive(tmp_path / "bomb.tar.gz", build, compress=True)
    assert path.stat().st_size < 100_000
    with pytest.raises(ImageRefused, match="inflates past"):
        open_archive(path, "docker-archive", tmp_path / "work", 1 << 20)
    assert list((tmp_path / "work").iterdir()) == []


def test_a_docker_archive_link_out_of_it_is_refused(tmp_path: Path) -> None:
    def build(tar: tarfile.TarFile) -> None:
        member(tar, "layer/layer.tar", type=tarfile.SYMTYPE, linkname="../../../etc/shadow")

    path = archive(tmp_path / "d.tar", build)
    with pytest.raises(ImageRefused, match="points out of it"):
        open_archive(path, "docker-archive", tmp_path / "work", 1 << 30)


def test_a_docker_archive_becomes_an_oci_layout_of_its_one_image(tmp_path: Path) -> None:
    config = b'{"architecture":"amd64","os":"linux","config":{}}'
    layer = b"\0" * 1024
    shared = hashlib.sha256(layer).hexdigest()

    def build(tar: tarfile.TarFile) -> None:
        member(tar, "cfg.json", config)
        member(tar, f"{shared}.tar", layer)
        member(tar, "a/layer.tar", type=tarfile.SYMTYPE, linkname=f"../{shared}.tar")
        member(tar, "manifest.json", b'[{"Config":"cfg.json","Layers":["a/layer.tar"]}]')

    path = archive(tmp_path / "d.tar", build)
    layout = open_archive(path, "docker-archive", tmp_path / "work", 1 << 30)
    assert (layout / "blobs" / "sha256" / shared).read_bytes() == layer
    assert (layout / "index.json").exists() and (layout / "oci-layout").exists()
