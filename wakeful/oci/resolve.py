"""The decisions of an image import, with no I/O: what a reference names, whether a manifest
(or an index of them) is one wakeful takes, which of an index's manifests a node runs, and
the `ImageRecord` an image's stored manifest and config make.

Rules, each checked before a blob is copied:
- a digest is the sha256 of the raw bytes the registry or archive gave, so the import pins
  exactly what was inspected;
- schema 1 manifests are refused (unsigned ones are unverifiable, every registry has had
  schema 2 since 2016);
- an index must have a manifest for the node's platform, else it is refused naming the
  platforms it has (attestations, `unknown/unknown`, are not platforms);
- a manifest has at most `MAX_LAYERS` layers, each of a type in `LAYER_TYPES`, every digest
  sha256, and declares no more bytes than the import's bound.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from wakeful.domain.models import (
    BLOB_DIGEST,
    LAYER_TYPES,
    MAX_LAYERS,
    ImageRecord,
    describe_validation_error,
)

from .errors import ImageRefused

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})

MAX_MANIFEST_BYTES = 4 << 20
"""What a registry must accept for a manifest (distribution spec); more is not read."""
MAX_CONFIG_BYTES = 4 << 20
"""An image config beyond this is refused before it is copied (real ones are kilobytes)."""
DEFAULT_PLATFORM = "linux/amd64"

_DIGEST = re.compile(BLOB_DIGEST)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_DOMAIN = re.compile(r"^(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_PLATFORM = re.compile(r"^[a-z0-9_]+/[a-z0-9_]+(?:/[a-z0-9_]+)?$")


@dataclass(frozen=True)
class Reference:
    """A registry reference, normalised as docker does (`shop` is `docker.io/library/shop`)."""

    domain: str
    path: str
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def host(self) -> str:
        """The domain without its port (and an IPv6 address without its brackets)."""
        if self.domain.startswith("["):
            return self.domain[1:].partition("]")[0]
        return self.domain.partition(":")[0]

    def source(self) -> str:
        """What skopeo reads: by digest when the reference has one, else by tag."""
        if self.digest is not None:
            return f"docker://{self.repository}@{self.digest}"
        return f"docker://{self.repository}:{self.tag or 'latest'}"

    def pinned(self, digest: str) -> str:
        return f"docker://{self.repository}@{digest}"


def parse_reference(ref: str) -> Reference:
    """`[DOMAIN/]PATH[:TAG][@sha256:HEX]` (a leading `docker://` allowed); ImageRefused,
    naming the reference, for anything else."""
    text = ref.removeprefix("docker://")
    name, _, digest = text.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ImageRefused(f"image {ref!r}: the digest must be sha256:<64 hex digits>")
    tag = None
    head, _, last = name.rpartition("/")
    if ":" in last:
        last, _, tag = last.partition(":")
        name = f"{head}/{last}" if head else last
        if not _TAG.match(tag):
            raise ImageRefused(f"image {ref!r}: tag {tag!r} is not a valid tag")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first[:1] == "["):
        domain, path = first, rest
    else:
        domain, path = "docker.io", name
    if not _DOMAIN.match(domain):
        raise ImageRefused(f"image {ref!r}: {domain!r} is not a registry host")
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    if not path or len(path) > 255 or not _PATH.match(path):
        raise ImageRefused(
            f"image {ref!r}: the repository name must be lowercase letters, digits and "
            "separators (. _ - /)"
        )
    return Reference(domain, path, tag, digest or None)


def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1, by the text of the reference (a DNS answer never
    decides that a registry may go without TLS)."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def digest_of(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: str | None = None


@dataclass(frozen=True)
class Manifest:
    media_type: str
    config: Descriptor
    layers: tuple[Descriptor, ...]

    @property
    def declared_bytes(self) -> int:
        return self.config.size + sum(layer.size for layer in self.layers)

    @property
    def blobs(self) -> list[str]:
        """The config's digest and the layers', each once, in order."""
        return list(dict.fromkeys([self.config.digest, *(layer.digest for layer in self.layers)]))


@dataclass(frozen=True)
class Index:
    media_type: str
    manifests: tuple[Descriptor, ...]


def parse_manifest(raw: bytes, ref: str) -> Manifest | Index:
    """A manifest or an index, from the raw bytes; schema 1, another kind of artifact, or
    anything malformed is ImageRefused."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: a deeply nested body
        raise ImageRefused(f"image {ref}: the manifest is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ImageRefused(f"image {ref}: the manifest is not a JSON object")
    media_type = body.get("mediaType")
    if body.get("schemaVersion") == 1 or "fsLayers" in body:
        raise ImageRefused(
            f"image {ref} is a docker schema 1 image; push it again with a current "
            "docker, podman or skopeo (schema 2 or OCI)"
        )
    if body.get("schemaVersion") != 2:
        raise ImageRefused(f"image {ref}: schemaVersion {body.get('schemaVersion')!r} is not 2")
    if media_type in INDEX_TYPES or (media_type is None and "manifests" in body):
        entries = _list(body, "manifests", ref)
        return Index(
            media_type or OCI_INDEX,
            tuple(_descriptor(entry, ref, "manifests") for entry in entries),
        )
    if media_type in MANIFEST_TYPES or (media_type is None and "layers" in body):
        layers = _list(body, "layers", ref)
        if len(layers) > MAX_LAYERS:
            raise ImageRefused(f"image {ref} has {len(layers)} layers; the bound is {MAX_LAYERS}")
        return Manifest(
            media_type or OCI_MANIFEST,
            _descriptor(body.get("config"), ref, "config"),
            tuple(_descriptor(entry, ref, "layers") for entry in layers),
        )
    raise ImageRefused(f"image {ref}: media type {media_type!r} is not an image manifest")


def _list(body: dict[str, Any], key: str, ref: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list):
        raise ImageRefused(f"image {ref}: the manifest's {key!r} is not a list")
    return value


def _descriptor(entry: object, ref: str, where: str) -> Descriptor:
    if not isinstance(entry, dict):
        raise ImageRefused(f"image {ref}: an entry of the manifest's {where!r} is not an object")
    digest, size, media_type = entry.get("digest"), entry.get("size"), entry.get("mediaType")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ImageRefused(f"image {ref}: {where} digest {digest!r} is not sha256:<64 hex digits>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageRefused(f"image {ref}: {where} {digest} has size {size!r}")
    if not isinstance(media_type, str):
        raise ImageRefused(f"image {ref}: {where} {digest} has no media type")
    if entry.get("urls"):  # a "foreign" layer, fetched from where the image says
        raise ImageRefused(f"image {ref}: {where} {digest} names URLs to fetch it from")
    return Descriptor(media_type, digest, size, _platform_of(entry.get("platform")))


def _platform_of(value: object) -> str | None:
    if not isinstance(value, dict):
        return None
    parts = [value.get("os"), value.get("architecture")]
    if value.get("variant"):
        parts.append(value.get("variant"))
    if not all(isinstance(part, str) and part for part in parts):
        return None
    return "/".join(str(part) for part in parts)


def check_platform(platform: str) -> str:
    """`os/arch[/variant]` (the setting), or ValueError."""
    if not _PLATFORM.match(platform):
        raise ValueError(f"platform {platform!r} is not os/arch[/variant] (say linux/amd64)")
    return platform


def platform_matches(have: str, want: str) -> bool:
    """`linux/arm64/v8` is a `linux/arm64`; a wanted variant must be there."""
    have_parts, want_parts = have.split("/"), want.split("/")
    return have_parts[: len(want_parts)] == want_parts


def pick(index: Index, platform: str, ref: str) -> Descriptor:
    """The index's first manifest for `platform`; ImageRefused naming the platforms it has."""
    for entry in index.manifests:
        if entry.platform is not None and platform_matches(entry.platform, platform):
            if entry.media_type not in MANIFEST_TYPES:
                raise ImageRefused(
                    f"image {ref}: the {platform} entry is a {entry.media_type!r}, "
                    "not an image manifest"
                )
            return entry
    has = sorted(
        {entry.platform for entry in index.manifests if entry.platform} - {"unknown/unknown"}
    )
    raise ImageRefused(
        f"image {ref} has no {platform} image; it has {', '.join(has) or 'no platforms'}"
    )


def check(manifest: Manifest, ref: str, max_bytes: int) -> None:
    """Refuse, before anything is copied, a manifest whose layers wakeful cannot unpack or
    whose declared size passes the bound (`parse_manifest` has bounded the layer count)."""
    for layer in manifest.layers:
        if layer.media_type not in LAYER_TYPES or "zstd" in layer.media_type:
            raise ImageRefused(
                f"image {ref}: layer {layer.digest} has media type {layer.media_type!r}; "
                "wakeful unpacks tar layers, uncompressed or gzip (not zstd yet)"
            )
    if manifest.config.size > MAX_CONFIG_BYTES:
        raise ImageRefused(
            f"image {ref}: its config is {manifest.config.size} bytes; "
            f"the bound is {MAX_CONFIG_BYTES}"
        )
    if manifest.declared_bytes > max_bytes:
        raise ImageRefused(
            f"image {ref} is {manifest.declared_bytes} bytes compressed; the bound is "
            f"{max_bytes} (WAKEFUL_IMAGE_MAX_BYTES)"
        )


def image_record(
    ref: str,
    *,
    digest: str,
    manifest_digest: str,
    manifest: Manifest,
    config_raw: bytes,
    platform: str,
) -> ImageRecord:
    """The record of a stored image, from its stored (OCI) manifest and config. An image
    whose config names another platform than the node's is refused here: a single manifest
    says its platform only in its config."""
    try:
        config = json.loads(config_raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: a deeply nested body
        raise ImageRefused(f"image {ref}: its config is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ImageRefused(f"image {ref}: its config is not a JSON object")
    have = _platform_of(config)
    if have is not None and not platform_matches(have, platform):
        raise ImageRefused(f"image {ref} is a {have} image; this cluster runs {platform}")
    run = config.get("config") or {}
    if not isinstance(run, dict):
        raise ImageRefused(f"image {ref}: its config's 'config' is not an object")
    ports = run.get("ExposedPorts") or {}
    try:
        return ImageRecord.model_validate(
            {
                "ref": ref,
                "digest": digest,
                "manifest": manifest_digest,
                "config_digest": manifest.config.digest,
                "layers": [
                    {"digest": layer.digest, "size": layer.size, "media_type": layer.media_type}
                    for layer in manifest.layers
                ],
                "platform": have if have is not None else platform,
                "config": {
                    "entrypoint": run.get("Entrypoint") or [],
                    "cmd": run.get("Cmd") or [],
                    "env": run.get("Env") or [],
                    "working_dir": run.get("WorkingDir") or "",
                    "user": run.get("User") or "",
                    "exposed_ports": sorted(ports) if isinstance(ports, dict) else ports,
                },
            }
        )
    except ValidationError as exc:
        reason = describe_validation_error(exc)
        if len(reason) > 300:
            reason = reason[:300] + "…"
        raise ImageRefused(f"image {ref}: {reason}") from None
