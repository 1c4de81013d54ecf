"""Image archives read by us, strictly, before skopeo sees anything of them.

skopeo 1.9 unpacks an `oci-archive` into its temporary directory itself, following the links
in it, as the control plane's user (root): an archive with `x -> /etc` and then `x/cron.d/y`
wrote outside (found by attacking it). So an archive never reaches skopeo: `open_archive`
reads it with `tarfile`, header by header, through `CappedStream` (no more bytes in all than
`max_bytes`, no single read past 8 MiB), and writes only regular files it names itself into a
fresh private directory, as an OCI image layout that skopeo then reads with its `oci:`
transport (which reads files in place, never unpacks):

- `oci-archive` (`podman save --format oci-archive`): the members may only be `oci-layout`,
  `index.json` and `blobs/sha256/<64 hex>` (and their directories); each blob must hash to
  its name.
- `docker-archive` (`docker save`, `podman save`): `manifest.json` names one image's config and
  layers, each a member read into a blob named by its sha256; an OCI manifest and index are
  written for them (layers as plain or gzip'd tar, by their first bytes). Other members
  (`repositories`, the legacy `<id>/json` and `VERSION`) are skipped unread; docker 25's OCI
  files beside them (`blobs/sha256/...`) are read the same way.

Anything else is refused naming the member: a link, a device, a sparse file, a name with `..`
or a leading `/`, a name given twice. A gzip'd archive is read as one.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any

from wakeful.aio.capped import CappedStream

from .errors import ImageRefused

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
_BLOB = re.compile(r"^blobs/sha256/([0-9a-f]{64})$")
_OCI_FILES = frozenset({"oci-layout", "index.json"})
_OCI_DIRS = frozenset({"blobs", "blobs/sha256"})
MAX_JSON = 4 << 20
"""A manifest.json, index.json or config is small: no more of one is read."""
CHUNK = 1 << 20


def open_archive(path: Path, transport: str, workspace: Path, max_bytes: int) -> Path:
    """The image of the archive at `path` (`oci-archive` or `docker-archive`) as an OCI image
    layout in a new 0700 directory under `workspace`, which the caller removes. Blocking:
    run it in a thread. `ImageRefused` naming the member and the reason."""
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    layout = Path(tempfile.mkdtemp(prefix="archive.", dir=workspace))
    try:
        (layout / "blobs" / "sha256").mkdir(mode=0o700, parents=True)
        with _Archive(path, max_bytes) as tar:
            if transport == "oci-archive":
                _read_oci(tar, layout)
            else:
                _read_docker(tar, layout)
    except BaseException:
        shutil.rmtree(layout, ignore_errors=True)
        raise
    return layout


class _Archive:
    """The archive's tar stream (inflated when gzip'd), bounded, open until the `with` ends."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self._file = path.open("rb")
        gzipped = self._file.read(2) == b"\x1f\x8b"
        self._file.seek(0)
        raw: io.BufferedIOBase = self._file
        if gzipped:
            raw = gzip.GzipFile(fileobj=self._file, mode="rb")
        ceiling = max_bytes + (1 << 20)  # what its members hold, and room for their headers
        self._stream = CappedStream(raw, ceiling, lambda why: ImageRefused(f"the archive {why}"))
        try:
            self.tar = tarfile.open(fileobj=self._stream, mode="r:")  # noqa: SIM115 - closed by __exit__
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
            self._file.close()
            raise ImageRefused(f"the archive is not a tar file ({exc})") from exc

    def __enter__(self) -> tarfile.TarFile:
        return self.tar

    def __exit__(self, *exc: object) -> None:
        self.tar.close()
        self._file.close()


def _members(tar: tarfile.TarFile, links: bool = False) -> Any:
    """Every member, checked: a directory or a regular file (or, with `links`, a symbolic
    link, which is never made: the caller reads it as a name for another member), inside,
    named once."""
    seen: set[str] = set()
    try:
        while (info := tar.next()) is not None:
            name = info.name.removeprefix("./").rstrip("/")
            if info.name.startswith("/") or ".." in name.split("/"):
                raise ImageRefused(f'the archive\'s member "{info.name}" leaves it')
            kinds = info.isfile() or info.isdir() or (links and info.issym())
            if info.issparse() or not kinds:
                raise ImageRefused(
                    f'the archive\'s member "{info.name}" is not a regular file or a directory'
                )
            if name in seen:
                raise ImageRefused(f'the archive names "{name}" twice')
            seen.add(name)
            yield name, info
            tar.members.clear()  # type: ignore[attr-defined]
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ImageRefused(f"the archive is not a readable tar file ({exc})") from exc


def _copy(tar: tarfile.TarFile, info: tarfile.TarInfo, target: Path) -> str:
    """The member's bytes into a new file `target` (never an existing one, never through a
    link: `O_EXCL | O_NOFOLLOW`), 0600; their sha256, `sha256:<hex>`."""
    source = tar.extractfile(info)
    assert source is not None
    digest = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return f"sha256:{digest.hexdigest()}"


def _read_oci(tar: tarfile.TarFile, layout: Path) -> None:
    for name, info in _members(tar):
        if info.isdir():
            if name not in _OCI_DIRS and name:
                raise ImageRefused(f'the archive\'s member "{name}" is not part of an OCI layout')
            continue
        found = _BLOB.match(name)
        if found is not None:
            digest = _copy(tar, info, layout / name)
            if digest != f"sha256:{found.group(1)}":
                raise ImageRefused(f"the archive's blob {name} hashes to {digest}")
        elif name in _OCI_FILES:
            if info.size > MAX_JSON:
                raise ImageRefused(f"the archive's {name} is over {MAX_JSON} bytes")
            _copy(tar, info, layout / name)
        else:
            raise ImageRefused(f'the archive\'s member "{name}" is not part of an OCI layout')
    if not (layout / "index.json").exists():
        raise ImageRefused("the archive has no index.json: is it an oci-archive?")
    if not (layout / "oci-layout").exists():
        (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')


def _read_docker(tar: tarfile.TarFile, layout: Path) -> None:
    """Every regular member as a blob (by its sha256), `manifest.json` read; then the OCI
    manifest and index for the one image it names."""
    blobs: dict[str, str] = {}
    aliases: dict[str, str] = {}
    manifest: bytes | None = None
    for name, info in _members(tar, links=True):
        if info.isdir():
            continue
        if info.issym():  # skopeo and docker link a layer two images share: a name, no more
            target = os.path.normpath(os.path.join(os.path.dirname(name), info.linkname))
            if target.startswith(("/", "..")):
                raise ImageRefused(f'the archive\'s link "{name}" points out of it')
            aliases[name] = target
            continue
        if name == "manifest.json":
            if info.size > MAX_JSON:
                raise ImageRefused(f"the archive's manifest.json is over {MAX_JSON} bytes")
            read = tar.extractfile(info)
            assert read is not None
            manifest = read.read()
            continue
        if name == "repositories" or name.endswith(("/json", "/VERSION")):
            continue
        partial = layout / "blobs" / "sha256" / f".member-{len(blobs)}"
        digest = _copy(tar, info, partial)
        final = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
        if final.exists():
            partial.unlink()
        else:
            partial.rename(final)
        blobs[name] = digest
    if manifest is None:
        raise ImageRefused("the archive has no manifest.json: is it a docker-archive?")
    for name, target in aliases.items():
        if target in blobs:
            blobs[name] = blobs[target]
    entry = _docker_entry(manifest)
    config = _named(blobs, entry.get("Config"), "Config")
    layers = [_named(blobs, each, "Layers") for each in entry.get("Layers") or []]
    image = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config, "size": _size(layout, config)},
        "layers": [
            {"mediaType": _layer_type(layout, each), "digest": each, "size": _size(layout, each)}
            for each in layers
        ],
    }
    data = json.dumps(image, separators=(",", ":")).encode()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    _write(layout / "blobs" / "sha256" / digest.removeprefix("sha256:"), data)
    index = {
        "schemaVersion": 2,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": digest, "size": len(data)}],
    }
    _write(layout / "index.json", json.dumps(index).encode())
    _write(layout / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')


def _docker_entry(raw: bytes) -> dict[str, Any]:
    try:
        found = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: a deeply nested body
        raise ImageRefused(f"the archive's manifest.json is not JSON ({exc})") from None
    if not isinstance(found, list) or not found or not isinstance(found[0], dict):
        raise ImageRefused("the archive's manifest.json names no image")
    if len(found) > 1:
        raise ImageRefused(f"the archive holds {len(found)} images: save one image per archive")
    return found[0]


def _named(blobs: dict[str, str], name: object, field: str) -> str:
    if not isinstance(name, str) or name.removeprefix("./") not in blobs:
        raise ImageRefused(f"the archive's manifest.json names {field} {name!r}, not in it")
    return blobs[name.removeprefix("./")]


def _size(layout: Path, digest: str) -> int:
    return (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).stat().st_size


def _layer_type(layout: Path, digest: str) -> str:
    with (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).open("rb") as blob:
        return OCI_TAR_GZIP if blob.read(2) == b"\x1f\x8b" else OCI_TAR


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
