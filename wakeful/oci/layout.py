"""The file work on an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/<hex>`),
synchronous: the store runs each function in a worker thread, under its lock.

skopeo writes the blobs and index.json of a pulled image; the blobs of an image built by the
CLI are uploaded one by one (`add_blob`) and named in index.json by us (`name_manifest`).
wakeful reads them, makes them private, touches their mtimes (the last time an import or a
deploy claimed them) and deletes what nothing references. index.json is only ever replaced
whole (write, fsync, rename).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from wakeful.domain.models import BLOB_DIGEST

from .errors import BlobMissing, ImageError, ImageRefused, ImageStorageError
from .resolve import MAX_MANIFEST_BYTES, Index, Manifest, parse_manifest

INDEX = "index.json"
REF_NAME = "org.opencontainers.image.ref.name"
_DIGEST = re.compile(BLOB_DIGEST)
_HEX = re.compile(r"^[0-9a-f]{64}$")
_DEBRIS = ("oci-put-blob", "oci-dest-")
"""Names of what a skopeo killed mid-copy leaves in the layout (its partial blobs)."""


def blobs(root: Path) -> Path:
    return root / "blobs" / "sha256"


def blob_path(root: Path, digest: str) -> Path:
    """Where the blob `digest` is; ValueError for anything but `sha256:<64 hex>` (a digest
    from a request never names another path)."""
    if not _DIGEST.match(digest):
        raise ValueError(f"digest {digest!r} is not sha256:<64 hex digits>")
    return blobs(root) / digest.removeprefix("sha256:")


def ensure(root: Path) -> None:
    """An empty layout at `root` if there is none; private either way."""
    try:
        blobs(root).mkdir(mode=0o700, parents=True, exist_ok=True)
        for folder in (root, root / "blobs", blobs(root)):
            folder.chmod(0o700)
        if not (root / "oci-layout").exists():
            _replace(root / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        if not (root / INDEX).exists():
            _replace(root / INDEX, b'{"schemaVersion":2,"manifests":[]}')
    except OSError as exc:
        raise ImageStorageError(f"cannot make the image store {root}: {exc.strerror}") from None


def read_index(root: Path) -> list[dict[str, Any]]:
    try:
        body = json.loads((root / INDEX).read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ImageStorageError(f"cannot read {root / INDEX}: {exc}") from None
    entries = body.get("manifests") if isinstance(body, dict) else None
    return [entry for entry in entries or [] if isinstance(entry, dict)]


def tagged(root: Path, name: str) -> str | None:
    """The digest of the manifest index.json names `name`."""
    for entry in read_index(root):
        if entry.get("annotations", {}).get(REF_NAME) == name:
            digest = entry.get("digest")
            return digest if isinstance(digest, str) else None
    return None


def read_blob(root: Path, digest: str, limit: int) -> bytes:
    """A stored blob's bytes, checked against its digest; ImageError when it is missing,
    larger than `limit` or does not match."""
    path = blob_path(root, digest)
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise BlobMissing(f"no blob {digest} in the image store") from None
    if len(data) > limit:
        raise ImageError(f"blob {digest} is over {limit} bytes")
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ImageError(f"stored blob {digest} does not match its digest")
    return data


def read_manifest(root: Path, digest: str, ref: str) -> tuple[Manifest, bytes]:
    """The image manifest `digest` stored at `root`, and its bytes; ImageRefused for an index
    (or anything but a manifest), ImageError when it is missing or does not match."""
    raw = read_blob(root, digest, MAX_MANIFEST_BYTES)
    found = parse_manifest(raw, ref)
    if isinstance(found, Index):
        raise ImageRefused(f"image {ref}: {digest} is an index, not one image's manifest")
    return found, raw


def sizes(root: Path, digests: list[str]) -> int:
    """The bytes the blobs `digests` take (each counted once)."""
    try:
        return sum(blob_path(root, digest).stat().st_size for digest in set(digests))
    except FileNotFoundError as exc:
        raise BlobMissing(
            f"a blob of the image is missing from the store: {exc.filename}"
        ) from None


def privatise(root: Path) -> None:
    """Blobs 0600 (skopeo writes them 0644; the directories are 0700 anyway)."""
    with os.scandir(blobs(root)) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mode & 0o077:
                    os.chmod(entry.path, 0o600)


def touch(root: Path, digests: set[str], now: float) -> bool:
    """Set the blobs' mtimes to `now`; False if any is missing."""
    present = True
    for digest in digests:
        try:
            os.utime(blob_path(root, digest), (now, now))
        except FileNotFoundError:
            present = False
        except OSError:  # a read-only disk: the blob is there all the same
            present = present and blob_path(root, digest).exists()
    return present


def claim(root: Path, digests: list[str], now: float) -> set[str]:
    """Those of `digests` stored, each claimed at `now` (its mtime), the rest left out."""
    held = set()
    for digest in digests:
        try:
            os.utime(blob_path(root, digest), (now, now))
            held.add(digest)
        except FileNotFoundError:
            pass
    return held


def scan(root: Path) -> list[tuple[str, float]]:
    found = []
    with contextlib.suppress(FileNotFoundError), os.scandir(blobs(root)) as entries:
        for entry in entries:
            if _HEX.match(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    found.append((f"sha256:{entry.name}", entry.stat().st_mtime))
    return sorted(found)


def prune(root: Path, referenced: set[str], before: float) -> list[str]:
    """Delete every blob not in `referenced` last claimed before `before`, then the
    index.json entries whose manifest is gone, then what a killed copy left behind. The
    deleted digests are returned."""
    removed = []
    for digest, mtime in scan(root):
        if digest not in referenced and mtime < before:
            with contextlib.suppress(FileNotFoundError):
                blob_path(root, digest).unlink()
                removed.append(digest)
    entries = read_index(root)
    kept = [entry for entry in entries if blob_path_exists(root, entry.get("digest"))]
    if len(kept) != len(entries):
        body = {"schemaVersion": 2, "manifests": kept}
        _replace(root / INDEX, json.dumps(body, separators=(",", ":")).encode())
    remove_debris(root)
    return removed


def blob_path_exists(root: Path, digest: object) -> bool:
    return (
        isinstance(digest, str)
        and _DIGEST.match(digest) is not None
        and (blob_path(root, digest).exists())
    )


def name_manifest(root: Path, name: str, digest: str, size: int) -> None:
    """index.json names the manifest `digest` `name` (an entry of that name replaced): what
    skopeo writes after a copy, written by us for an image whose blobs were uploaded."""
    entries = [e for e in read_index(root) if e.get("annotations", {}).get(REF_NAME) != name]
    entries.append(
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
            "annotations": {REF_NAME: name},
        }
    )
    body = {"schemaVersion": 2, "manifests": entries}
    _replace(root / INDEX, json.dumps(body, separators=(",", ":")).encode())


def unname_manifest(root: Path, name: str) -> None:
    """index.json no longer names `name` (an import refused after `name_manifest`)."""
    entries = read_index(root)
    kept = [e for e in entries if e.get("annotations", {}).get(REF_NAME) != name]
    if len(kept) != len(entries):
        body = {"schemaVersion": 2, "manifests": kept}
        _replace(root / INDEX, json.dumps(body, separators=(",", ":")).encode())


def add_blob(root: Path, source: Path, digest: str, now: float) -> None:
    """The file `source` (its sha256 already checked to be `digest`) moved into the layout,
    private and claimed at `now`; one already there is kept and claimed instead."""
    target = blob_path(root, digest)
    if target.exists():
        source.unlink()
    else:
        source.chmod(0o600)
        os.replace(source, target)
    os.utime(target, (now, now))


def remove_debris(root: Path) -> int:
    """Delete the partial blobs a killed skopeo left (no copy is running: the caller holds
    the lock)."""
    removed = 0
    for folder in (root, blobs(root)):
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(_DEBRIS) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
    return removed


def _replace(path: Path, data: bytes) -> None:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise
