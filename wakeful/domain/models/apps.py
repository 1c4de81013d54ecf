"""An app as a user deploys it: its spec (`[run]`, `[health]`, `[concurrency]`, `[resources]`
and `[state]` of wakeful.toml), the app and its versions, and who holds a stateful app's state.

| key                         | model    |
|-----------------------------|----------|
| `apps/{app}`                | App      |
| `versions/{app}/{version}`  | Version  |
| `states/{app}`              | AppState |
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from wakeful.domain.models.base import Digest, Host, Model, Name
from wakeful.domain.models.images import ImageRecord

MAX_SPLIT = 16
"""Versions one split may name."""
MAX_TAGS = 32
"""Tags one app may hold."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = frozenset({"PORT", "HOST"})


_SECONDS = "must be a number of seconds or a duration such as 90s, 5m, 1.5h or 250ms"


def _in_seconds(value: object) -> object:
    """Before pydantic's check of a field in seconds: true is not 1 second, and a string the
    manifest could not read as a duration (`deploy.appdir.parse_duration`) says what it takes,
    where pydantic would say it is not a number."""
    if isinstance(value, bool):
        raise ValueError(_SECONDS)
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            raise ValueError(_SECONDS) from None
    return value


class HealthCheck(Model):
    """How a sandbox is judged ready: an HTTP GET of `path`, the standard gRPC health check
    (`grpc = true`), or a TCP connect when neither is asked for."""

    path: Annotated[str, StringConstraints(pattern=r"^/[^\s]*$", max_length=1024)] | None = None
    grpc: bool = Field(
        default=False,
        strict=True,
        description="probe with grpc.health.v1.Health/Check over h2c (SERVING is ready)",
    )
    timeout: float = Field(default=30.0, gt=0, le=3600, description="seconds to become ready")

    _seconds = field_validator("timeout", mode="before")(_in_seconds)

    @model_validator(mode="after")
    def _one_check(self) -> Self:
        if self.grpc and self.path is not None:
            raise ValueError("grpc: a gRPC health check has no path (set one or the other)")
        return self


class Concurrency(Model):
    """How a pool is sized.

    `auto`: `requests_per_instance` is a scaling target (not an admission cap); the pool
    grows with demand and shrinks when idle. `fixed`: the pool keeps exactly
    `min_instances` (= `max_instances`) sandboxes. `hard_limit`, when set, is an admission cap
    per sandbox in either mode (Knative's containerConcurrency).
    """

    mode: Literal["auto", "fixed"] = "auto"
    requests_per_instance: int = Field(default=10, ge=1, le=10_000)
    scale_down_delay: float = Field(
        default=300.0,
        ge=5,
        le=86_400,
        description="seconds without traffic before a sandbox counts as idle (traffic is "
        "reported every 2 s, so shorter delays would stop busy sandboxes)",
    )
    suspend_delay: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="seconds without traffic (and with no lease on it) before a running "
        "sandbox is frozen: it keeps its memory and its port, uses no CPU, and wakes in "
        "milliseconds; 0 turns the suspended tier off (at least 1 otherwise)",
    )
    min_instances: int = Field(default=0, ge=0, le=1000)
    max_instances: int = Field(default=20, ge=1, le=1000)
    hard_limit: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="requests one sandbox may carry at once; past it on every sandbox a "
        "request waits (bounded) for room or a new sandbox. None: no cap",
    )

    _seconds = field_validator("scale_down_delay", "suspend_delay", mode="before")(_in_seconds)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.hard_limit is not None and self.hard_limit < self.requests_per_instance:
            raise ValueError(
                f"hard_limit ({self.hard_limit}) must be at least requests_per_instance "
                f"({self.requests_per_instance}): the target has to fit under the cap"
            )
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"min_instances ({self.min_instances}) must not exceed "
                f"max_instances ({self.max_instances})"
            )
        if self.mode == "fixed" and self.min_instances != self.max_instances:
            raise ValueError(
                "fixed mode keeps exactly one size: min_instances "
                f"({self.min_instances}) must equal max_instances ({self.max_instances})"
            )
        if self.mode == "fixed" and self.min_instances == 0:
            raise ValueError("fixed mode needs min_instances >= 1")
        if 0 < self.suspend_delay < 1:
            raise ValueError(
                f"suspend_delay ({self.suspend_delay:g}) must be 0 (no suspended tier) or at "
                "least 1 second"
            )
        return self


UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
SIZE = re.compile(r"^\s*(\d{1,12})\s*(Ki|Mi|Gi)?\s*$")
MIN_SIZE, MAX_SIZE = 16 << 20, 64 << 30


def parse_size(text: str | int) -> int:
    """`"256Mi"` -> bytes. Plain integers are bytes; Ki, Mi and Gi are powers of 1024."""
    if isinstance(text, int):
        return text
    found = SIZE.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a size (write e.g. 256Mi, 1Gi or a number of bytes)")
    return int(found.group(1)) * UNITS[found.group(2) or ""]


def format_size(size: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)


class Resources(Model):
    """What one sandbox may use. Enforced by the node: cgroups (memory, pids) where it can
    write them, rlimits otherwise; `open_files` is always an rlimit."""

    memory: int = Field(
        default=512 << 20,
        description="bytes, or a size such as 256Mi or 1Gi (16Mi to 64Gi); past it the "
        "sandbox is killed and reported as out of memory",
    )
    disk: int = Field(
        default=1 << 30,
        description="bytes the app may write into its own directory (16Mi to 64Gi); the "
        "directory is memory-backed where the node is root, so writes count against memory",
    )
    processes: int = Field(default=256, ge=8, le=65_536, description="processes and threads")
    open_files: int = Field(default=4096, ge=64, le=1_048_576)

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_size(value)
        return value

    @field_validator("memory", "disk")
    @classmethod
    def _size_bounds(cls, value: int) -> int:
        if not MIN_SIZE <= value <= MAX_SIZE:
            raise ValueError(
                f"must be between {format_size(MIN_SIZE)} and {format_size(MAX_SIZE)} "
                f"(got {format_size(value)})"
            )
        return value


STATE_PATH = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
"""A relative path inside the app's tree: plain names, no leading `/` (and no `.` or `..`
part, `StateSpec._inside`)."""


class StateSpec(Model):
    """`[state]` in wakeful.toml: a directory of the app's tree that outlives its sandbox.
    It is archived when the sandbox stops and restored when the app wakes, on any node."""

    path: Annotated[str, StringConstraints(pattern=STATE_PATH, max_length=255)] = Field(
        description="a directory inside the app's tree, e.g. data"
    )

    @field_validator("path")
    @classmethod
    def _inside(cls, path: str) -> str:
        if any(part in (".", "..") for part in path.split("/")):
            raise ValueError(f"{path!r} must name a directory inside the app's tree")
        return path


class RolloutRules(Model):
    """`[rollout]` in wakeful.toml: when a ramping version is rolled back by itself (issue
    39; `wakeful.domain.split.verdict`), compared with the stable version over the same
    window. Strict: `"0.05"` or `true` in wakeful.toml is refused, not read as a number."""

    model_config = ConfigDict(strict=True)

    max_error_ratio: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="how far the new version's 5xx share may exceed the stable version's "
        "(0.05: 5 points)",
    )
    max_p99_ratio: float = Field(
        default=2.0,
        ge=1,
        le=1000,
        description="how many times the stable version's p99 the new version's may reach",
    )
    min_requests: int = Field(
        default=50,
        ge=1,
        le=1_000_000,
        description="the new version's requests in a window below which nothing is decided",
    )
    min_p99_increase_ms: float = Field(
        default=25.0,
        ge=0,
        le=600_000,
        description="milliseconds the new version's p99 must also exceed the stable "
        "version's by: closer p99s are alike (a new sandbox's first answers)",
    )


MADE = r"^[A-Za-z0-9][A-Za-z0-9 ()+._/:-]{0,119}$"
"""How a version was made, in words (`stack node (package.json + package-lock.json)`)."""
IMAGE_REF = r"^(oci-archive:|docker-archive:)?[^\s]+$"
"""A registry reference (`registry.example.com/team/shop:1.4`, `...@sha256:<hex>`), or an
archive in the app's directory (`oci-archive:shop.tar`, `docker-archive:shop.tar`)."""


class AppSpec(Model):
    """What a user deploys: how to run the app and how to size it."""

    command: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        default_factory=list,
        max_length=256,
        description="what runs; for an image, overrides its Entrypoint and Cmd",
    )
    image: Annotated[str, StringConstraints(pattern=IMAGE_REF, max_length=1024)] | None = Field(
        default=None,
        description="an OCI image to run instead of the app's directory (a registry reference, "
        "or oci-archive:FILE / docker-archive:FILE in the app's directory)",
    )
    env: dict[str, Annotated[str, StringConstraints(max_length=32_768)]] = Field(
        default_factory=dict, max_length=512
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65_535,
        description="fixed port to listen on; by default a free port is passed in PORT",
    )
    health: HealthCheck = Field(default_factory=HealthCheck)
    concurrency: Concurrency = Field(default_factory=Concurrency)
    resources: Resources = Field(default_factory=Resources)
    shutdown_timeout: float = Field(default=10.0, gt=0, le=3600)
    activation_timeout: float = Field(default=120.0, gt=0, le=3600)
    state: StateSpec | None = None
    rollout: RolloutRules = Field(default_factory=RolloutRules)
    server_timing: bool = Field(default=False, strict=True)
    """Answers carry `Server-Timing` (queue, wake, upstream): it tells anyone whether the app
    was asleep, so it is off unless the app, or the ingress as a whole, turns it on."""
    access_log: bool = Field(default=False, strict=True)
    """Every ingress records each of its requests in its access log (`wakeful logs --access`);
    an ingress with WAKEFUL_ACCESS_LOG records every app's anyway."""
    access_log_query: bool = Field(default=False, strict=True)
    """Its access lines keep the query string (off: it can carry tokens and personal data)."""
    protocol: Literal["http1", "h2c"] = Field(
        default="http1",
        description='what the app serves on its port: "http1" (HTTP/1.1), or "h2c" '
        "(cleartext HTTP/2 with prior knowledge: gRPC services); the ingress speaks it to "
        "its sandboxes whatever its clients speak",
    )

    _seconds = field_validator("shutdown_timeout", "activation_timeout", mode="before")(_in_seconds)

    @model_validator(mode="after")
    def _something_to_run(self) -> Self:
        if not self.command and self.image is None:
            if "command" in self.model_fields_set:
                raise ValueError("command: empty: the program to run, then its arguments")
            raise ValueError("command: required (or image, to run an OCI image)")
        if self.image is not None and self.state is not None:
            raise ValueError(
                "state: not yet for an app from an image, or built into one from its directory "
                "(its [state] would be archived from the image's tree, which wakeful does not do "
                "safely yet); use a directory app (`[build] enabled = false`)"
            )
        return self

    @model_validator(mode="after")
    def _one_writer(self) -> Self:
        if self.state is not None and self.concurrency.max_instances != 1:
            raise ValueError(
                "state: an app with [state] runs one sandbox at a time, so it needs "
                f"concurrency.max_instances = 1 (got {self.concurrency.max_instances})"
            )
        return self

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"{name!r} is set by wakeful and cannot be overridden")
        return env


class App(Model):
    name: Name
    hosts: list[Host] = Field(default_factory=list, max_length=64)
    default_host: bool = True
    """Whether `<name>.<base_domain>` routes to it (`default_host = false` in wakeful.toml)."""
    active_version: Name | None = None
    previous_version: Name | None = None
    split: dict[Name, Annotated[int, Field(ge=0, le=100)]] = Field(
        default_factory=dict, max_length=MAX_SPLIT
    )
    """Whole percents over versions, summing to 100, in the order given (`wakeful traffic`,
    `deploy --canary`); empty: every request goes to `active_version`
    (`wakeful.domain.split`)."""
    tags: dict[Name, Name] = Field(default_factory=dict, max_length=MAX_TAGS)
    """Tag → version: `TAG--APP.<base domain>` reaches that version whatever the split."""

    @model_validator(mode="after")
    def _routes(self) -> Self:
        if self.split:
            total = sum(self.split.values())
            if total != 100:
                raise ValueError(f"split: the percents add up to {total}, not 100")
            if self.active_version not in self.split:
                raise ValueError(f"split: the active version {self.active_version} has no share")
        for tag in self.tags:
            if "--" in tag:
                raise ValueError(f"tag {tag!r} holds '--', which separates a tag from its app")
        return self


class Version(Model):
    app: Name
    version: Name
    spec: AppSpec
    artifact: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    image: ImageRecord | None = None
    """The image this version runs, pinned at deploy (`spec.image` resolved)."""
    created_at: float = 0.0
    made: Annotated[str, StringConstraints(pattern=MADE)] | None = None
    """How it was made, as the deploy said: `Containerfile`, `stack python (requirements.txt)`
    (None: a directory or an image, as `artifact` and `image` tell; `made_by`)."""


def made_by(version: Version) -> str:
    """How `version` was made, as `wakeful versions` shows it."""
    if version.made is not None:
        return version.made
    return "image" if version.image is not None else "directory"


class AppState(Model):
    """The state of an app with `[state]` (`states/{app}`): who holds it and its latest archive.

    Ownership moves only by compare-and-set on (node, epoch) (`wakeful.domain.state`): the pool
    controller adopts it for the sandbox it places (`node`, `sandbox` set, epoch + 1); the
    holding node releases it when that sandbox stops, with the archive it just stored (`node`
    cleared, epoch + 1). At rest (the app at zero) it belongs to no node. Only the digest lives
    here; the archive's bytes are in the control plane's blob store, beside the artifacts."""

    app: Name
    node: Name | None = None
    epoch: int = Field(default=0, ge=0)
    sandbox: str | None = Field(default=None, max_length=200)
    archive: Digest | None = None
    """sha256 of the latest archive (None: never archived; the app's files seed the state)."""
    size: int = Field(default=0, ge=0)
    archived_at: float = 0.0
    archived_epoch: int = Field(default=0, ge=0)
    """The epoch of the holder that wrote `archive`."""
    released_by: Name | None = None
    released_at: float = 0.0
    moved_from: Name | None = None
    """The node that held it before its current (or last) holder, when they differ."""
    moved_at: float = 0.0
    error: str = Field(default="", max_length=4000)
    """Why the last hand-off did not go as it should (cleared when it is adopted again)."""
    kept: bool = False
    """Its holder could not archive or store it and keeps it, with `error` saying where."""
