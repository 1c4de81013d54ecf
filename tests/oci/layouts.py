"""Tiny OCI images written by hand into an OCI image layout, for the image-import tests: a
layer of a few files, a config, a manifest, an index of several platforms, or a manifest no
registry would hold (10,000 layers). Private to tests/oci (the node's unpack tests have their
own builder)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def layer(files: dict[str, bytes]) -> bytes:
    """A gzipped tar of `files` (name → content), reproducible byte for byte."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


@dataclass
class Layout:
    """An OCI image layout being written: blobs first, then the tags in index.json."""

    dir: Path

    def __post_init__(self) -> None:
        (self.dir / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.dir / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        if not (self.dir / "index.json").exists():
            self._write_index([])

    def blob(self, media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
        found = descriptor(media_type, data, **extra)
        (self.dir / "blobs" / "sha256" / found["digest"].removeprefix("sha256:")).write_bytes(data)
        return found

    def tagged(self, name: str) -> str:
        """The digest index.json names `name`."""
        for entry in json.loads((self.dir / "index.json").read_text())["manifests"]:
            if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == name:
                return str(entry["digest"])
        raise KeyError(name)

    def manifest_of(self, target: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.read(target["digest"]))
        return found

    def read(self, digest: str) -> bytes:
        return (self.dir / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()

    def image(
        self,
        layers: list[bytes],
        *,
        platform: str = "linux/amd64",
        config: dict[str, Any] | None = None,
        layer_type: str = OCI_LAYER,
    ) -> dict[str, Any]:
        """A manifest of `layers` (each stored once), its descriptor returned."""
        os_name, arch = platform.split("/", 1)
        diff_ids = [
            "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest() for data in layers
        ]
        body = {
            "architecture": arch,
            "os": os_name,
            "config": config or {"Cmd": ["/bin/busybox", "true"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        config_desc = self.blob(OCI_CONFIG, json.dumps(body).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config_desc,
            "layers": [self.blob(layer_type, data) for data in layers],
        }
        return self.blob(
            OCI_MANIFEST,
            json.dumps(manifest).encode(),
            platform={"os": os_name, "architecture": arch},
        )

    def index(self, manifests: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.blob(OCI_INDEX, json.dumps(body).encode())

    def tag(self, name: str, target: dict[str, Any]) -> str:
        """Name `target` `name` in index.json; the `oci:DIR:NAME` reference is returned."""
        index = json.loads((self.dir / "index.json").read_text())
        entries = [
            entry
            for entry in index["manifests"]
            if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") != name
        ]
        plain = {key: target[key] for key in ("mediaType", "digest", "size")}
        entries.append({**plain, "annotations": {"org.opencontainers.image.ref.name": name}})
        self._write_index(entries)
        return f"oci:{self.dir}:{name}"

    def _write_index(self, manifests: list[dict[str, Any]]) -> None:
        body = {"schemaVersion": 2, "manifests": manifests}
        (self.dir / "index.json").write_text(json.dumps(body))


def copy(source: str, target: str, *, all: bool = False) -> None:
    """skopeo copies `source` to `target` (an archive, say)."""
    argv = ["skopeo", "copy", *(["--all"] if all else []), source, target]
    done = subprocess.run(argv, capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
