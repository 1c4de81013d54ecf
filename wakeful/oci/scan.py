"""What an image is checked for before umoci unpacks a byte of it: by the control plane when
it imports the image at deploy (so a hostile image is refused there, naming its reason), and
again by every node before it unpacks (a node trusts no blob it did not check).

An image is hostile input. The manifest must list exactly the layers the version pinned
(`check_manifest`). Then every layer is read header by header with `tarfile` (never
extracted), and the image is refused whole when a header breaks a rule (`refusal`, pure):

- a name that is absolute or has a `..` part (umoci would confine it to the root; a name that
  needs confining is refused all the same);
- a whiteout of `.` or `..`, or an opaque whiteout of the root (it would empty the image);
- a hard link whose target is absolute or has a `..` part;
- more bytes than `max_unpacked` or more entries than `max_files`, counted over all layers
  from the headers, so a gzip bomb is refused at its header, before it is inflated.

Symbolic links are legal whatever they point at (Debian has absolute ones and ones that climb
out of the root); umoci resolves every path inside the root, so a file written through one
lands in the tree. Device nodes become empty files under `--rootless`, and the tree walk
removes FIFOs and sockets (`unpack.settle`).

The tar stream goes through `CappedStream` (`wakeful.aio.capped`): no single read over
`MAX_READ` (tarfile reads a pax or long-name header whole, and one that claims gigabytes
would be read into memory) and no more inflated bytes than the bounds allow.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wakeful.aio.capped import CappedStream
from wakeful.domain.models.images import ImageRecord, Layer

from .errors import ImageRefused as ImageError

GZIP_TYPES = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    }
)
TAR_TYPES = frozenset(
    {"application/vnd.oci.image.layer.v1.tar", "application/vnd.docker.image.rootfs.diff.tar"}
)
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def check_manifest(image: ImageRecord, data: bytes) -> None:
    """Refuse a manifest that is not the one the version pinned: its config and its layers
    (digest, size and media type, in order) must be the record's."""
    try:
        manifest = json.loads(data)
        config = manifest["config"]["digest"]
        layers = [
            Layer(digest=one["digest"], size=one["size"], media_type=one["mediaType"])
            for one in manifest["layers"]
        ]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ImageError(f"manifest {image.manifest} is not an OCI manifest ({exc})") from exc
    if config != image.config_digest:
        raise ImageError(
            f"manifest {image.manifest} names config {config}; the version pinned "
            f"{image.config_digest}"
        )
    if layers != image.layers:
        raise ImageError(
            f"manifest {image.manifest} lists {len(layers)} layers that are not the "
            f"{len(image.layers)} the version pinned ({_first_difference(layers, image.layers)})"
        )


def _first_difference(found: Sequence[Layer], pinned: Sequence[Layer]) -> str:
    for number, (one, other) in enumerate(zip(found, pinned, strict=False), start=1):
        if one != other:
            return f"layer {number} is {one.digest} ({one.size} bytes), pinned {other.digest}"
    return "one list is longer"


class _Noting(tarfile.TarInfo):
    """A header that remembers which extended headers gave it its name and its link: GNU's
    long name or long link, and a pax header's path or linkpath. Go's archive/tar (umoci)
    takes the GNU one where Python's tarfile takes the pax one, so an entry carrying both
    could pass this scan under one name and be unpacked under the other: refused
    (`refusal`). Hooks tarfile's own header readers, whose names are stable since 3.x."""

    gnu_name = False
    gnu_link = False
    pax_name = False
    pax_link = False

    def _proc_gnulong(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        found = super()._proc_gnulong(tar)  # type: ignore[misc]
        if self.type == tarfile.GNUTYPE_LONGNAME:
            found.gnu_name = True
        else:
            found.gnu_link = True
        return found  # type: ignore[no-any-return]

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        found = super()._proc_pax(tar)  # type: ignore[misc]
        found.pax_name = found.pax_name or "path" in found.pax_headers
        found.pax_link = found.pax_link or "linkpath" in found.pax_headers
        return found  # type: ignore[no-any-return]


def refusal(info: tarfile.TarInfo) -> str | None:
    """Why this entry is refused, or None when it is allowed (pure)."""
    name = info.name
    if getattr(info, "gnu_name", False) and getattr(info, "pax_name", False):
        return f'entry "{name}" has two names (a pax path and a GNU long name)'
    if getattr(info, "gnu_link", False) and getattr(info, "pax_link", False):
        return f'entry "{name}" has two link targets (a pax linkpath and a GNU long link)'
    if info.issparse() or info.type == tarfile.GNUTYPE_SPARSE:
        return f'entry "{name}" is a sparse file'
    if name.startswith("/"):
        return f'entry "{name}" is an absolute path'
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        return f'entry "{name}" leaves the root'
    base = parts[-1] if parts else ""
    if base == OPAQUE and len(parts) == 1:
        return f'opaque whiteout "{name}" would empty the root'
    if base.startswith(WHITEOUT) and base != OPAQUE and base[len(WHITEOUT) :] in ("", ".", ".."):
        return f'whiteout "{name}" names "{base[len(WHITEOUT) :]}"'
    if info.islnk():
        target = info.linkname
        if target.startswith("/") or ".." in target.split("/"):
            return f'hard link "{name}" -> "{target}" points outside the root'
    return None


@dataclass
class Budget:
    """What the layers of one image may add up to, counted from their headers."""

    max_unpacked: int
    max_files: int
    size: int = 0
    files: int = 0

    def take(self, info: tarfile.TarInfo) -> str | None:
        """Count this entry; why the image is now over its bounds, or None."""
        return self.add(max(info.size, 0), 1)

    def add(self, size: int, files: int) -> str | None:
        """Count `files` entries of `size` bytes in all (a layer counted before); why the
        image is now over its bounds, or None."""
        self.files += files
        self.size += size
        if self.size > self.max_unpacked:
            return f"unpacks to more than {self.max_unpacked} bytes (the bound)"
        if self.files > self.max_files:
            return f"holds more than {self.max_files} entries (the bound)"
        return None


def scan_layer(path: Path, layer: Layer, budget: Budget) -> None:
    """Read every header of the layer blob at `path` (blocking: run it in a thread);
    `ImageError` naming the layer and the entry at the first rule it breaks."""
    where = f"layer {layer.digest}"
    if "zstd" in layer.media_type:
        raise ImageError(
            f"{where} is zstd-compressed ({layer.media_type}): wakeful cannot unpack zstd "
            "layers yet (umoci 0.4.7 reads gzip and plain tar); rebuild it with gzip layers"
        )
    if layer.media_type not in GZIP_TYPES | TAR_TYPES:
        raise ImageError(f"{where} has media type {layer.media_type}, which is not a tar layer")
    ceiling = budget.max_unpacked + (budget.max_files + 1) * 4 * tarfile.BLOCKSIZE
    try:
        with (
            open(path, "rb") as raw,
            _capped(raw, layer.media_type in GZIP_TYPES, ceiling) as stream,
            tarfile.open(fileobj=stream, mode="r:", tarinfo=_Noting) as tar,
        ):
            while (info := tar.next()) is not None:
                reason = refusal(info) or budget.take(info)
                if reason is not None:
                    raise ImageError(f"{where}: {reason}")
                # Headers are not extracted: not kept either (tarfile keeps a list of them).
                tar.members.clear()  # type: ignore[attr-defined]
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise ImageError(f"{where} is not a readable tar layer ({exc})") from exc


def _capped(raw: io.BufferedReader, gzipped: bool, ceiling: int) -> CappedStream:
    """A layer's tar stream (inflated when `gzipped`), refused past `ceiling` bytes."""
    inflated: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
    return CappedStream(inflated, ceiling, ImageError)
