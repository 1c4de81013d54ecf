"""A layer read by `wakeful.oci.scan` is read as umoci (Go's archive/tar) would unpack it: an
entry whose name or link target two extended headers give differently is refused, and so is a
sparse entry (what it would write is not what it weighs)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from wakeful.domain.models import Layer
from wakeful.oci import ImageRefused
from wakeful.oci.scan import Budget, scan_layer

TAR = "application/vnd.oci.image.layer.v1.tar"


def two_names(name: str, long: str, kind: bytes = tarfile.XHDTYPE) -> bytes:
    """One file whose pax header says `name` and whose GNU long-name header says `long`:
    Python's tarfile takes the first, Go's the second."""
    pax = tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
        {"path": name}, kind, "utf-8"
    )
    gnu = tarfile.TarInfo._create_gnu_long_header(  # type: ignore[attr-defined]
        long, tarfile.GNUTYPE_LONGNAME, "utf-8", "surrogateescape"
    )
    info = tarfile.TarInfo("short")
    info.size = 1
    body = info.tobuf(tarfile.USTAR_FORMAT) + b"x".ljust(tarfile.BLOCKSIZE, b"\0")
    return pax + gnu + body + b"\0" * (2 * tarfile.BLOCKSIZE)


def sparse_layer() -> bytes:
    info = tarfile.TarInfo("holes")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = 0
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info)
    return out.getvalue()


def scan(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "layer"
    path.write_bytes(data)
    layer = Layer(digest="sha256:" + "0" * 64, size=len(data), media_type=TAR)
    scan_layer(path, layer, Budget(1 << 30, 1000))


def test_an_entry_with_a_pax_name_and_a_gnu_long_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageRefused, match="has two names"):
        scan(tmp_path, two_names("benign", "../../../../tmp/escaped" + "x" * 100))


def test_a_sparse_entry_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageRefused, match="is a sparse file"):
        scan(tmp_path, sparse_layer())


def test_a_long_name_alone_is_fine(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("a/" + "b" * 200)
        tar.addfile(info, io.BytesIO(b""))
    scan(tmp_path, out.getvalue())
