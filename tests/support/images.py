"""OCI images built in pure Python, for tests that need one without a registry.

An image is a list of layers, each a list of tar entries made by the small constructors below
(`file`, `directory`, `symlink`, `hardlink`, `whiteout`, `opaque`, `device`, `fifo`, `zeros`),
written into an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/<hex>`) as
`skopeo`, `umoci` and `wakeful.node.images.testing.DirectoryBlobs` read it::

    layout = OciLayout(tmp_path / "layout")
    image = layout.add_image(
        "site",
        [layer(directory("www"), file("www/index.html", b"hi\\n"))],
        ImageConfig(entrypoint=["/bin/busybox", "httpd"], exposed_ports=["8080/tcp"]),
    )
    image.ref  # "test/site:1", tagged "site" in the layout's index.json

`add_image` returns the `ImageRecord` the control plane would pin for it: the manifest's
digest, the config's, and each layer's digest, size and media type. Entries are written in
the order given, as a hostile image would write them: nothing here checks that a name stays
inside the root (that is what the tests of the node's checks need).

`busybox_image` is a small image that really runs: Debian's `busybox-static` as `/bin/busybox`,
serving `/www` with `httpd` on port 8080.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from wakeful.domain.models.images import ImageConfig, ImageRecord, Layer

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
TAR = "application/vnd.oci.image.layer.v1.tar"
TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
BUSYBOX = Path("/usr/bin/busybox")
"""Debian's `busybox-static`: one static binary, so the image needs no libraries."""


@dataclass(frozen=True)
class Entry:
    """One tar member: its header, and its data (`size` zero bytes when `zeros` is set, so a
    file of gigabytes is never held)."""

    info: tarfile.TarInfo
    data: bytes = b""
    zeros: int = 0


def _info(name: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.mtime = 0
    return info


def file(
    name: str,
    data: bytes = b"",
    *,
    mode: int = 0o644,
    uid: int = 0,
    gid: int = 0,
    xattrs: Mapping[str, bytes] | None = None,
) -> Entry:
    """A regular file. `mode` may carry setuid/setgid bits (0o4755); `xattrs` are written as
    pax `SCHILY.xattr.<name>` records, as docker and buildah write `security.capability`."""
    info = _info(name, tarfile.REGTYPE, mode, uid, gid)
    info.size = len(data)
    if xattrs:
        info.pax_headers = {
            f"SCHILY.xattr.{key}": value.decode("latin-1") for key, value in xattrs.items()
        }
    return Entry(info, data)


def zeros(name: str, size: int) -> Entry:
    """A file of `size` zero bytes, streamed as it is written: a gzip'd layer holding one is
    about a thousandth of `size` (a decompression bomb)."""
    info = _info(name, tarfile.REGTYPE, 0o644, 0, 0)
    info.size = size
    return Entry(info, zeros=size)


def directory(name: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(_info(name, tarfile.DIRTYPE, mode, uid, gid))


def symlink(name: str, target: str) -> Entry:
    """A symbolic link; `target` is written as given (absolute, or `../..` out of the root)."""
    info = _info(name, tarfile.SYMTYPE, 0o777, 0, 0)
    info.linkname = target
    return Entry(info)


def hardlink(name: str, target: str) -> Entry:
    """A hard link to `target`, a member's name (or, in a hostile image, a host path)."""
    info = _info(name, tarfile.LNKTYPE, 0o644, 0, 0)
    info.linkname = target
    return Entry(info)


def whiteout(name: str) -> Entry:
    """Deletes `name` of a lower layer: the empty file `<dir>/.wh.<base>`."""
    parent, _, base = name.rpartition("/")
    return file(f"{parent}/.wh.{base}" if parent else f".wh.{base}")


def opaque(name: str) -> Entry:
    """Hides everything lower layers put in the directory `name` (`""` or `"."`: the root)."""
    return file(".wh..wh..opq" if name in ("", ".") else f"{name}/.wh..wh..opq")


def device(
    name: str, kind: Literal["char", "block"] = "char", major: int = 1, minor: int = 3
) -> Entry:
    """A device node (by default 1:3, `/dev/null`)."""
    info = _info(name, tarfile.CHRTYPE if kind == "char" else tarfile.BLKTYPE, 0o666, 0, 0)
    info.devmajor, info.devminor = major, minor
    return Entry(info)


def fifo(name: str) -> Entry:
    return Entry(_info(name, tarfile.FIFOTYPE, 0o644, 0, 0))


@dataclass(frozen=True)
class LayerSpec:
    entries: Sequence[Entry]
    gzip: bool = True


def layer(*entries: Entry, gzip: bool = True) -> LayerSpec:
    """A layer of `entries`, in order; gzip'd (`tar+gzip`) unless `gzip=False` (`tar`)."""
    return LayerSpec(entries, gzip)


class _Hashing(io.RawIOBase):
    """Counts and hashes what is written through it to `out`."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


class _Zeros(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        buffer[:] = bytes(len(buffer))
        return len(buffer)


def tar_bytes(entries: Sequence[Entry], *, compress: bool) -> tuple[bytes, str]:
    """The layer's blob and its diff id (the sha256 of the uncompressed tar). PAX format, so
    xattrs and long names survive; a `zeros` entry is streamed, never held."""
    blob = io.BytesIO()
    zipped = gzip.GzipFile(fileobj=blob, mode="wb", mtime=0, compresslevel=6) if compress else None
    hashing = _Hashing(zipped if zipped is not None else blob)
    with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            if entry.zeros:
                tar.addfile(entry.info, io.BufferedReader(_Zeros(), 1 << 20))
            else:
                tar.addfile(entry.info, io.BytesIO(entry.data) if entry.info.isreg() else None)
    if zipped is not None:
        zipped.close()
    return blob.getvalue(), f"sha256:{hashing.sha.hexdigest()}"


@dataclass
class OciLayout:
    """An OCI image layout at `path` (made when first written to), holding any number of
    images, each tagged by its name in `index.json`."""

    path: Path
    tags: dict[str, dict[str, object]] = field(default_factory=dict)

    def blob_path(self, digest: str) -> Path:
        return self.path / "blobs" / "sha256" / digest.removeprefix("sha256:")

    def add_blob(self, data: bytes) -> str:
        """Store `data`; its digest (`sha256:<hex>`)."""
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        target = self.blob_path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        return digest

    def add_image(
        self,
        name: str,
        layers: Sequence[LayerSpec],
        config: ImageConfig | None = None,
        *,
        ref: str | None = None,
    ) -> ImageRecord:
        """Write the image's layers, config and manifest, tag it `name`; the record a deploy
        would pin for it (`ref`, by default `test/<name>:1`)."""
        config = config or ImageConfig()
        pinned: list[Layer] = []
        diff_ids: list[str] = []
        for spec in layers:
            data, diff_id = tar_bytes(spec.entries, compress=spec.gzip)
            media_type = TAR_GZIP if spec.gzip else TAR
            pinned.append(Layer(digest=self.add_blob(data), size=len(data), media_type=media_type))
            diff_ids.append(diff_id)
        config_blob = _json(oci_config(config, diff_ids))
        config_digest = self.add_blob(config_blob)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": len(config_blob)},
            "layers": [
                {"mediaType": one.media_type, "digest": one.digest, "size": one.size}
                for one in pinned
            ],
        }
        manifest_blob = _json(manifest)
        manifest_digest = self.add_blob(manifest_blob)
        self.tags[name] = {
            "mediaType": MANIFEST_TYPE,
            "digest": manifest_digest,
            "size": len(manifest_blob),
            "annotations": {"org.opencontainers.image.ref.name": name},
        }
        index = {"schemaVersion": 2, "manifests": list(self.tags.values())}
        (self.path / "index.json").write_bytes(_json(index))
        return ImageRecord(
            ref=ref or f"test/{name}:1",
            digest=manifest_digest,
            manifest=manifest_digest,
            config_digest=config_digest,
            layers=pinned,
            config=config,
        )


def oci_config(config: ImageConfig, diff_ids: Sequence[str]) -> dict[str, object]:
    """The OCI image config for `config` (only the keys it sets) over layers `diff_ids`."""
    run: dict[str, object] = {}
    if config.user:
        run["User"] = config.user
    if config.env:
        run["Env"] = list(config.env)
    if config.entrypoint:
        run["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        run["Cmd"] = list(config.cmd)
    if config.working_dir:
        run["WorkingDir"] = config.working_dir
    if config.exposed_ports:
        run["ExposedPorts"] = {port: {} for port in config.exposed_ports}
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
    }


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


BUSYBOX_LINKS = ("sh", "httpd", "ls", "cat", "echo", "id", "sleep", "wget")
INDEX_HTML = b"<h1>hello from an image</h1>\n"


def busybox_layers(*, index_html: bytes = INDEX_HTML, uid: int = 0) -> list[LayerSpec]:
    """Debian's static busybox at `/bin/busybox` with its applets linked beside it, and
    `/www/index.html` (owned by `uid`); a `/etc/passwd` naming root, `app` (1000) and nobody."""
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} is missing: install Debian's busybox-static")
    passwd = (
        b"root:x:0:0:root:/root:/bin/sh\n"
        b"app:x:1000:1000:app:/www:/bin/sh\n"
        b"nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
    )
    system = layer(
        directory("bin"),
        file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755),
        *(symlink(f"bin/{name}", "busybox") for name in BUSYBOX_LINKS),
        directory("etc"),
        file("etc/passwd", passwd),
        file("etc/group", b"root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"),
        directory("tmp", mode=0o1777),
    )
    site = layer(
        directory("www", uid=uid, gid=uid),
        file("www/index.html", index_html, uid=uid, gid=uid),
    )
    return [system, site]


BUSYBOX_CONFIG = ImageConfig(
    entrypoint=["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"],
    env=["PATH=/bin"],
    working_dir="/www",
    exposed_ports=["8080/tcp"],
)


def busybox_image(layout: OciLayout, name: str = "busybox", *, user: str = "") -> ImageRecord:
    """A small image that runs: busybox `httpd` serving `/www` on 8080 (`BUSYBOX_CONFIG`).
    With `user` (`"1000"`, `"app"`), the image runs as that user and `/www` is uid 1000's."""
    config = BUSYBOX_CONFIG.model_copy(update={"user": user})
    return layout.add_image(name, busybox_layers(uid=1000 if user else 0), config)


def copy_layout(source: OciLayout, path: Path) -> OciLayout:
    """A copy of `source` at `path` (a test that tampers with a blob does it to its copy)."""
    shutil.copytree(source.path, path)
    return OciLayout(path, dict(source.tags))


SKIPPED_STDLIB = frozenset(
    {"test", "site-packages", "dist-packages", "idlelib", "tkinter", "turtledemo", "ensurepip"}
)


def python_layer() -> LayerSpec:
    """This machine's Python 3 as an image layer, at the paths it has here (`/usr/bin/python3`,
    its standard library, the shared libraries it and its extension modules load, and the
    dynamic loader), so an app written for the host's Python runs from an image made of
    nothing but files of this machine: no registry, no package download. ~30 MB, plain tar."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    executable = Path("/usr/bin") / version
    stdlib = Path("/usr/lib") / version
    if not executable.exists() or not stdlib.is_dir():
        raise FileNotFoundError(f"{executable} or {stdlib} is missing: install Debian's python3")
    files: dict[str, Path] = {}
    for path in stdlib.rglob("*"):
        parts = path.relative_to(stdlib).parts
        if parts[0] in SKIPPED_STDLIB or "__pycache__" in parts or not path.is_file():
            continue
        files[str(path)] = path
    objects = [executable, *stdlib.glob("lib-dynload/*.so")]
    for library in _libraries(objects):
        files[library] = Path(library)
    entries: dict[str, Entry] = {}
    for name in sorted({*files, str(executable)}):
        source = Path(name).resolve()
        for parent in reversed(Path(name).parents[:-1]):
            entries.setdefault(str(parent)[1:], directory(str(parent)[1:]))
        mode = source.stat().st_mode & 0o755
        entries[name[1:]] = file(name[1:], source.read_bytes(), mode=mode)
    entries["usr/bin/python3"] = symlink("usr/bin/python3", version)
    entries.setdefault("tmp", directory("tmp", mode=0o1777))
    return layer(*entries.values(), gzip=False)


def _libraries(objects: Sequence[Path]) -> set[str]:
    """The shared libraries `objects` load (`ldd`), the loader among them, by the paths the
    loader looks for them at (`/lib64/ld-linux-x86-64.so.2`, `/lib/x86_64-linux-gnu/...`)."""
    found: set[str] = set()
    for each in objects:
        listed = subprocess.run(["ldd", str(each)], capture_output=True, text=True, check=False)
        for line in listed.stdout.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and Path(word).exists():
                    found.add(word)
    return found
