"""An app that runs an OCI image: the image as a version pins it (`ImageRecord`), and the parts
of its config that decide how it runs (`ImageConfig`).

A version records the image as it was resolved once, at deploy: the digest the registry (or
the archive) named, and the digest of the OCI manifest the control plane stored, whose config
and layers every node fetches from the control plane by digest. A later push to the same tag
changes nothing until the next deploy.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from .base import Model

BLOB_DIGEST = r"^sha256:[0-9a-f]{64}$"
BlobDigest = Annotated[str, StringConstraints(pattern=BLOB_DIGEST)]
"""A content digest as OCI writes it: `sha256:<hex>`."""

MAX_LAYERS = 128
"""More layers than any real image has (docker's own bound is 127): a manifest naming more is
refused before anything is fetched."""

LAYER_TYPES = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    }
)

ImageText = Annotated[str, StringConstraints(max_length=4096)]


class ImageConfig(Model):
    """What the image's config says about running it (the OCI config's `config`)."""

    entrypoint: list[ImageText] = Field(default_factory=list, max_length=256)
    cmd: list[ImageText] = Field(default_factory=list, max_length=256)
    env: list[Annotated[str, StringConstraints(max_length=32_768)]] = Field(
        default_factory=list, max_length=512
    )
    working_dir: Annotated[str, StringConstraints(max_length=1024)] = ""
    user: Annotated[str, StringConstraints(max_length=256)] = ""
    exposed_ports: list[Annotated[str, StringConstraints(max_length=32)]] = Field(
        default_factory=list, max_length=256
    )

    @field_validator("working_dir")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if path and not path.startswith("/"):
            raise ValueError(f"WorkingDir must be an absolute path (got {path!r})")
        return path

    @field_validator("env")
    @classmethod
    def _entries(cls, env: list[str]) -> list[str]:
        for entry in env:
            if "\0" in entry or entry.startswith("="):
                raise ValueError(f"Env entry {entry[:64]!r} is not NAME=value")
        return env


class Layer(Model):
    digest: BlobDigest
    size: int = Field(ge=0)
    media_type: Annotated[str, StringConstraints(max_length=255)]


class ImageRecord(Model):
    """An image pinned by a deploy (`Version.image`)."""

    ref: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    """What the user wrote (`registry.example.com/shop:1.4`, `oci-archive:shop.tar`)."""
    digest: BlobDigest
    """The manifest digest the registry or archive gave: what `wakeful versions` shows and a
    later pull by digest gets."""
    manifest: BlobDigest
    """The OCI manifest the control plane stored (the same as `digest` unless it was
    converted from docker's format): what nodes fetch."""
    config_digest: BlobDigest
    layers: list[Layer] = Field(max_length=MAX_LAYERS)
    platform: Annotated[str, StringConstraints(max_length=64)] = "linux/amd64"
    config: ImageConfig = Field(default_factory=ImageConfig)

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)


def image_env(config: ImageConfig) -> dict[str, str]:
    """The image's `Env` as a mapping (`NAME=value` entries; one without `=` is skipped)."""
    env: dict[str, str] = {}
    for entry in config.env:
        name, sep, value = entry.partition("=")
        if sep and name:
            env[name] = value
    return env


def exposed_port(config: ImageConfig) -> int | None:
    """The image's one exposed TCP port (`EXPOSE 8080`); None when it exposes none or several."""
    ports = set()
    for entry in config.exposed_ports:
        number, _, proto = entry.partition("/")
        if proto in ("", "tcp") and number.isdigit() and 0 < int(number) < 65_536:
            ports.add(int(number))
    return ports.pop() if len(ports) == 1 else None
