"""What the deploy routes (`deploy.api`) take and answer: the bodies of a deploy and of a
node's state hand-back, and the reports of a rollout, a deletion and the apps."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.rollout import Phase
from wakeful.domain.models import (
    BLOB_DIGEST,
    MADE,
    NAME_PATTERN,
    SANDBOX_ID_PATTERN,
    App,
    ImageRecord,
)
from wakeful.domain.split import Window


class SandboxAt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=SANDBOX_ID_PATTERN)
    revision: int = Field(ge=0, description="the record's revision as read; 0: absent")


class ReleaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str = Field(pattern=NAME_PATTERN)
    epoch: int = Field(ge=1)
    archive: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    size: int = Field(default=0, ge=0)
    error: str = Field(default="", max_length=4000)
    sandbox: SandboxAt | None = None
    """Release only while this sandbox's record is at this revision."""


class KeepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str = Field(pattern=NAME_PATTERN)
    epoch: int = Field(ge=1)
    error: str = Field(max_length=4000)
    for_good: bool = True


class DeployRequest(BaseModel):
    definition: AppDefinition
    artifact: str | None = None
    image_archive: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """An image archive uploaded for this deploy (`PUT /v1/images/archives`)."""
    image_manifest: str | None = Field(default=None, pattern=BLOB_DIGEST)
    """The manifest of an image the CLI built and uploaded (`image = "built:APP"`)."""
    made: str | None = Field(default=None, pattern=MADE)
    """How the version was made (a Containerfile, a stack): `wakeful versions` shows it."""
    canary: int = Field(default=0, ge=0, le=99)
    """`--canary N`: once ready the version takes N% beside the active one (0: all)."""
    ramp: float = Field(default=0.0, ge=0, le=7 * 86400)
    """`--ramp`: seconds from the first share (the canary's, or 1%) to 100% (0: none)."""
    keep_split: bool = False
    """`--keep-split`: the version joins the route at 0%, the split as it is."""


class RolloutReport(BaseModel):
    app: str
    version: str
    pool: str
    phase: Phase
    message: str
    ready: int
    target_ready: int


class RoutedReport(BaseModel):
    """Whether the ingresses the control plane knows have followed the store past an app's
    record (`GET /v1/apps/{app}/routed`)."""

    app: str
    revision: int
    """The store revision of the app's record."""
    ingresses: int
    """Ingresses that say which revision their routes have followed (`Leases.routes`)."""
    behind: dict[str, int]
    """Those still behind when the answer was given, by name, with the revision each has
    followed: empty once every one routes the app as it is."""


class DeletionReport(BaseModel):
    app: str
    versions: int
    pools: list[str]
    """Retired: their sandboxes drain (requests on them finish), then the pools go."""
    artifacts_removed: int
    """Deleted by the artifact collection run after the deletion: unreferenced artifacts
    uploaded more than the grace period ago (a newer one goes in a later run)."""


class AppReport(BaseModel):
    name: str
    hosts: list[str]
    default_host: bool
    active_version: str | None
    previous_version: str | None
    versions: list[str]
    split: dict[str, int] = Field(default_factory=dict)
    """Percent per version (empty: all to the active version)."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Tag → version."""
    images: dict[str, str] = Field(default_factory=dict)
    """For each version that runs an image: `REF@sha256:...`, as it was pinned at deploy."""
    made: dict[str, str] = Field(default_factory=dict)
    """For each version: how it was made (directory, image, Containerfile, stack ...)."""


def pinned(image: ImageRecord) -> str:
    """`REF@sha256:...`: the reference with the digest it was pinned to (once, when the
    reference named it already)."""
    if image.ref.endswith(f"@{image.digest}"):
        return image.ref
    return f"{image.ref}@{image.digest}"


class SplitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    split: list[Annotated[str, StringConstraints(max_length=80)]] = Field(
        min_length=1, max_length=16
    )
    """`VERSION=PERCENT` each (`v7=90`, `latest=10`), as `wakeful traffic` takes them."""


class TagRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(pattern=NAME_PATTERN)
    """A deployed version, or `latest`."""


FIGURES_SECONDS = 60.0
"""The window `wakeful traffic` shows each version's figures over."""


class VersionFigures(BaseModel):
    requests: int
    requests_per_s: float
    error_ratio: float
    """5xx answers over requests (0 with none)."""
    p99_ms: float | None


class TrafficReport(BaseModel):
    app: str
    active_version: str | None
    split: dict[str, int]
    """Percent per version, in order; empty: all to the active version."""
    tags: dict[str, str]
    """Tag → version."""
    window_seconds: float = FIGURES_SECONDS
    figures: dict[str, VersionFigures] = Field(default_factory=dict)
    """Per version the app routes, over the last `window_seconds` and up to 10 s more (whole
    10 s slots; the rate is over the time they cover), from the ingresses' reports: only
    while the app has a split or tags."""


def traffic_report(app: App, windows: dict[str, Window] | None = None) -> TrafficReport:
    figures = {
        version: VersionFigures(
            requests=w.requests,
            requests_per_s=round(w.requests / w.seconds, 2),
            error_ratio=round(w.error_ratio, 4),
            p99_ms=round(w.p99 * 1000, 1) if w.requests else None,
        )
        for version, w in (windows or {}).items()
    }
    return TrafficReport(
        app=app.name,
        active_version=app.active_version,
        split=dict(app.split),
        tags=dict(app.tags),
        figures=figures,
    )
