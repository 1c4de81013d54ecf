"""A build as `wakeful deploy DIR` runs it, where the CLI runs: the context checked, the
Containerfile (the directory's, or the one its stack generates) built by the builder found
here, the result copied into this app's OCI layout in the build cache (or pushed to a
registry, `[build] push`).

The build cache is bounded: for each app, one tagged image in the builder's storage
(`localhost/wakeful-build/APP:latest`; the previous build's image is removed once the next one
succeeded, its layers that the new one shares kept) and one OCI layout holding only the latest
build's blobs (`WAKEFUL_BUILD_CACHE/APP/layout`). The builder's own layer cache (the dependency
layer a code-only change reuses) is the builder's: `podman image prune` clears it.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.deploy.appdir import AppDir
from wakeful.oci import layout

from .context import (
    MAX_CONTEXT_BYTES,
    MAX_CONTEXT_FILES,
    ContextSize,
    check_context,
    ignore_patterns,
    own_ignore_file,
)
from .tools import Builder, Out, find_builder

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TAG = "localhost/wakeful-build/{app}:latest"


class BuildEnvironment(BaseSettings):
    """The CLI's build settings (`WAKEFUL_` variables)."""

    model_config = SettingsConfigDict(env_prefix="WAKEFUL_", extra="ignore")
    builder: str | None = None
    """podman, buildah or docker (default: the first of them installed)."""
    build_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "wakeful" / "builds")
    build_max_context: int = Field(default=MAX_CONTEXT_BYTES, ge=1)
    build_max_files: int = Field(default=MAX_CONTEXT_FILES, ge=1)
    build_ca: Path | None = None
    """A CA bundle the build may need to reach a package index (a proxy's), passed as the
    build secret `extra_ca` (default: the system's bundle, when there is one)."""

    @field_validator("build_cache")
    @classmethod
    def _nameable(cls, path: Path) -> Path:
        if ":" in str(path):  # skopeo's and podman's `oci:PATH:TAG` would split it
            raise ValueError(f"{str(path)!r}: a path with ':' cannot be named to the builder")
        return path


@dataclass(frozen=True)
class Built:
    made: str
    builder: str
    context: ContextSize
    manifest: str | None = None
    """The built image's manifest digest, in `layout` (None when pushed)."""
    layout: Path | None = None
    pushed: str | None = None
    """`REPOSITORY@sha256:...` when `[build] push` sent it to a registry."""
    seconds: tuple[float, float] = (0.0, 0.0)
    """How long the build took, and the copy out of the builder (or the push)."""


def containerfile_of(app_dir: AppDir) -> str:
    """The Containerfile the build uses, as text (the directory's own, or the generated)."""
    plan = app_dir.plan
    if plan.generated is not None:
        return plan.generated
    assert plan.containerfile is not None
    return (app_dir.path / plan.containerfile).read_text(errors="replace")


def build(app_dir: AppDir, environment: BuildEnvironment, out: Out) -> Built:
    """Build `app_dir` (a Containerfile or a stack), streaming the builder's output to
    `out`. ContextRefused, BuilderError (BuildFailed), OSError."""
    plan, name = app_dir.plan, app_dir.definition.name
    tool = find_builder(environment.builder)
    patterns = ignore_patterns(app_dir.path, plan.ignore, tool, plan.containerfile)
    size = check_context(
        app_dir.path,
        patterns,
        max_bytes=environment.build_max_context,
        max_files=environment.build_max_files,
    )
    cache = environment.build_cache / name
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    containerfile = app_dir.path / plan.containerfile if plan.containerfile else None
    ignorefile = None
    if plan.generated is not None:
        containerfile = cache / "Containerfile"
        containerfile.write_text(plan.generated)
        for stale in ("Containerfile.dockerignore", "ignore"):  # an earlier build's defaults
            (cache / stale).unlink(missing_ok=True)
        if own_ignore_file(app_dir.path, tool) is None:
            # What the walk left out, the builder leaves out: podman and buildah read it from
            # --ignorefile, docker (BuildKit) from `<Containerfile>.dockerignore` beside it.
            ignorefile = cache / ("Containerfile.dockerignore" if tool == "docker" else "ignore")
            ignorefile.write_text("\n".join(patterns) + "\n")
    assert containerfile is not None
    ca = environment.build_ca or (CA_BUNDLE if CA_BUNDLE.is_file() else None)
    builder = Builder(tool)
    tag = TAG.format(app=name)
    previous = builder.image_id(tag)
    started = time.monotonic()
    builder.build(
        containerfile,
        app_dir.path,
        tag,
        out=out,
        ignorefile=ignorefile,
        ca=ca,
        labels=(f"dev.wakeful.app={name}", f"dev.wakeful.made={plan.made}"),
    )
    built_at = time.monotonic()
    current = builder.image_id(tag)
    if previous is not None and previous != current:
        builder.remove(previous)
    if app_dir.build.push is not None:
        short = (current or "latest").removeprefix("sha256:")[:12]
        digest = builder.push(tag, f"{app_dir.build.push}:{short}")
        seconds = (built_at - started, time.monotonic() - built_at)
        return Built(
            plan.made, tool, size, pushed=f"{app_dir.build.push}@{digest}", seconds=seconds
        )
    root = cache / "layout"
    manifest = builder.export(tag, root, cache / "tmp")
    keep_only(root, manifest, tag)
    seconds = (built_at - started, time.monotonic() - built_at)
    return Built(plan.made, tool, size, manifest=manifest, layout=root, seconds=seconds)


def keep_only(root: Path, manifest: str, ref: str) -> None:
    """The layout at `root` holds the image `manifest` alone (an earlier build's blobs that
    the new one does not share are deleted)."""
    wanted = {manifest, *layout.read_manifest(root, manifest, ref)[0].blobs}
    layout.prune(root, wanted, float("inf"))
    shutil.rmtree(root.parent / "tmp", ignore_errors=True)
