"""Reading an app directory's `wakeful.toml` into a validated definition.

A bad file is refused with the file, the field and the reason, before anything is written:

    examples/hello/wakeful.toml: concurrency.requests_per_instance: must be >= 1 (got 0)

So is a host reserved whatever the control plane's settings (an IP address, `localhost`:
`wakeful.domain.hosts.reserved`); the control plane refuses the rest at deploy.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from wakeful.domain.hosts import reserved
from wakeful.domain.models import NAME_PATTERN, AppSpec, Host, describe_validation_error
from wakeful.domain.stacks import (
    BUILT_KINDS,
    CONTAINERFILES,
    BuildChoice,
    Plan,
    PlanError,
    plan,
)

MANIFEST = "wakeful.toml"
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?\s*\Z")
r"""ASCII digits (`\d` takes other scripts' digits, and `float` reads them), the unit right
after the number."""
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class AppDirError(ValueError):
    pass


class AppDefinition(BaseModel):
    """What a user deploys: the app's name and hosts, and its spec."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    hosts: list[Host] = Field(default_factory=list, max_length=64)
    default_host: bool = Field(default=True, strict=True)
    """False: `<name>.<base_domain>` does not route to it (only its `hosts` do)."""
    spec: AppSpec


ARCHIVE_PREFIXES = ("oci-archive:", "docker-archive:")
BUILT = "built:"
"""The `image` of an app built from its directory (`built:APP`): the deploy names the image's
manifest, uploaded just before; never written in a wakeful.toml."""
MAX_READ = 8 << 20
"""The largest top-level file read to decide the plan (a requirements or lock file, main.py)."""


class BuildSettings(BaseModel):
    """`[build]` in wakeful.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, strict=True)
    """False: a directory with a stack file (requirements.txt, ...) stays a directory app."""
    base: str | None = Field(default=None, pattern=r"^[^\s]+$", max_length=1024)
    """The image a stack build starts from, instead of the stack's default."""
    containerfile: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    """A Containerfile of another name, at the top of the directory (`Containerfile.prod`)."""
    push: str | None = Field(default=None, pattern=r"^[^\s@]+$", max_length=1024)
    """Push the built image to this repository (`registry.example.com/team/shop`) and deploy
    it from there, instead of uploading it to the control plane."""

    @field_validator("push")
    @classmethod
    def _a_repository(cls, push: str | None) -> str | None:
        if push is not None and ":" in push.rsplit("/", 1)[-1]:
            raise ValueError(
                f"{push!r} names a tag: give the repository alone (the build tags it by its "
                "image id, and the deploy pins the digest)"
            )
        return push


DIRECTORY = Plan("directory", "directory")
NO_BUILD_SETTINGS = BuildSettings()


@dataclass(frozen=True)
class Prebuilt:
    """An image built before `wakeful up` started, in an OCI layout on this machine."""

    layout: Path
    manifest: str


@dataclass(frozen=True)
class AppDir:
    path: Path
    definition: AppDefinition
    plan: Plan = DIRECTORY
    build: BuildSettings = NO_BUILD_SETTINGS
    prebuilt: Prebuilt | None = None
    made: str | None = None
    """How `wakeful up` made its image (a build: `Containerfile`, `stack ...`), when it did."""

    @property
    def archive(self) -> Path | None:
        """The image archive `image` names in this directory (`oci-archive:shop.tar`)."""
        image = self.definition.spec.image
        if image is None or not image.startswith(ARCHIVE_PREFIXES):
            return None
        return self.path / image.partition(":")[2]


def archive_problem(directory: Path, image: str) -> str | None:
    """Why `image`, an archive reference, cannot be read from `directory` (None: it can):
    a relative path to a regular file inside it."""
    name = image.partition(":")[2]
    if not name or name.startswith("/") or ".." in Path(name).parts:
        return f"{image!r} must name a file inside the app directory (e.g. oci-archive:shop.tar)"
    path = directory / name
    if not path.is_file() or path.is_symlink():
        return f"{image!r}: {path} is not a file"
    if not path.resolve().is_relative_to(directory.resolve()):  # a linked directory on the way
        return f"{image!r}: {path} leads outside the app directory"
    return None


def image_definition(image: str, name: str, port: int | None) -> AppDefinition:
    """`wakeful deploy --image REF --name APP [--port N]`: an image with no directory."""
    spec: dict[str, Any] = {"image": image}
    if port is not None:
        spec["port"] = port
    return AppDefinition.model_validate({"name": name, "spec": spec})


def parse_duration(value: object) -> object:
    """Seconds as a number, or a string like "90s", "5m", "1.5h", "250ms"."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            return value  # pydantic names the field and the value
        return float(match.group(1)) * _UNITS[match.group(2)]
    return value


def definition_from_manifest(raw: dict[str, Any]) -> AppDefinition:
    """The manifest's flat layout (`command`, `[health]`, ...) into a definition."""
    raw = dict(raw)
    name = raw.pop("name", None)
    hosts = raw.pop("hosts", [])
    routing: dict[str, Any] = {}
    if "default_host" in raw:
        routing["default_host"] = raw.pop("default_host")
    concurrency = raw.get("concurrency")
    if isinstance(concurrency, dict):
        raw["concurrency"] = {
            **concurrency,
            **{
                key: parse_duration(concurrency[key])
                for key in ("scale_down_delay", "suspend_delay")
                if key in concurrency
            },
        }
    for key in ("shutdown_timeout", "activation_timeout"):
        if key in raw:
            raw[key] = parse_duration(raw[key])
    health = raw.get("health")
    if isinstance(health, dict) and "timeout" in health:
        raw["health"] = {**health, "timeout": parse_duration(health["timeout"])}
    named = {} if name is None else {"name": name}  # absent: pydantic says "required"
    return AppDefinition.model_validate({**named, "hosts": hosts, **routing, "spec": raw})


def load_app_dir(path: Path) -> AppDir:
    # A link to an app directory is that directory (packing never follows links inside it).
    path = path.resolve()
    manifest = path / MANIFEST
    if not path.is_dir():
        raise AppDirError(f"{path}: not a directory")
    if manifest.is_file():
        try:
            raw = tomllib.loads(manifest.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise AppDirError(f"{manifest}: not valid TOML: {exc}") from exc
    else:  # a directory that is built needs none: the app is named after the directory
        raw = {"name": path.name}
    build, found = _plan(path, manifest, raw)
    if not manifest.is_file():
        if found.kind not in BUILT_KINDS:
            raise AppDirError(
                f"{manifest}: missing (an app directory needs a {MANIFEST}, unless it is built: "
                "a Containerfile, a requirements.txt, a package.json, a go.mod)"
            )
        if re.fullmatch(NAME_PATTERN, path.name) is None:
            raise AppDirError(
                f"{path}: no {MANIFEST}, so the app would be named after its directory, "
                f'{path.name!r}, which is not a DNS label: add a {MANIFEST} saying name = "..."'
            )
    if found.kind in BUILT_KINDS:
        raw = {**raw, "image": f"{BUILT}{raw.get('name')}"}
    try:
        definition = definition_from_manifest(raw)
    except ValidationError as exc:
        # The manifest is flat: `spec.` is not a path a user wrote, and a check of the
        # whole spec names its fields in its own message.
        described = describe_validation_error(exc).replace("spec.", "").replace("spec: ", "")
        raise AppDirError(f"{manifest}: {described}") from exc
    image = definition.spec.image
    if image is not None and image.startswith(ARCHIVE_PREFIXES):
        problem = archive_problem(path, image)
        if problem is not None:
            raise AppDirError(f"{manifest}: image: {problem}")
    for host in definition.hosts:
        reason = reserved(host)
        if reason is not None:
            raise AppDirError(f"{manifest}: hosts: {reason}")
    return AppDir(path, definition, found, build)


def _plan(path: Path, manifest: Path, raw: dict[str, Any]) -> tuple[BuildSettings, Plan]:
    """`[build]` (taken out of `raw`) and what the directory is (`wakeful.domain.stacks`)."""
    try:
        build = BuildSettings.model_validate(raw.pop("build", {}))
    except ValidationError as exc:
        raise AppDirError(f"{manifest}: build.{describe_validation_error(exc)}") from exc
    image, command = raw.get("image"), raw.get("command")
    if isinstance(image, str) and image.startswith(BUILT):
        raise AppDirError(
            f"{manifest}: image: {image!r}: `built:` names an image wakeful built from a "
            "directory; leave `image` out to build this one"
        )
    names = frozenset(
        entry.name for entry in path.iterdir() if entry.is_file() and not entry.is_symlink()
    )
    for name in (build.containerfile or "", *CONTAINERFILES):
        if name and (path / name).is_symlink():
            raise AppDirError(
                f"{path / name}: a link; a Containerfile must be a file of the directory itself"
            )

    def read(name: str) -> str | None:
        if name not in names:
            return None
        with (path / name).open("rb") as file:
            data = file.read(MAX_READ + 1)
        if len(data) > MAX_READ:
            raise PlanError(f"{name}: larger than {MAX_READ} bytes")
        return data.decode("utf-8", errors="replace")

    choice = BuildChoice(
        enabled=build.enabled,
        base=build.base,
        containerfile=build.containerfile,
        image=image is not None,
        command=tuple(c for c in command if isinstance(c, str))
        if isinstance(command, list)
        else (),
    )
    try:
        return build, plan(names, read, choice)
    except PlanError as exc:
        raise AppDirError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise AppDirError(f"{path}: cannot read it: {exc}") from exc
