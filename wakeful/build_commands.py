"""The commands that build an app directory where the CLI runs (issue 37): `wakeful deploy
DIR` of a directory with a Containerfile or a stack's files (built, then sent blob by blob, only
what the control plane lacks, or pushed to a registry), `wakeful deploy --dry-run DIR`, and
`wakeful up DIR`'s build before it serves. The build itself is `wakeful.build`'s."""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections.abc import Sequence

from wakeful.build import (
    BuildEnvironment,
    BuilderError,
    BuildFailed,
    Built,
    ContextRefused,
    build,
    containerfile_of,
    upload,
)
from wakeful.deploy.appdir import AppDefinition, AppDir, Prebuilt
from wakeful.domain.stacks import BUILT_KINDS
from wakeful.oci import ImageError

from .commands import RUNTIME, CliError, Pause, follow_rollout, say
from .remote import ControlClient


def deploy_built(
    api: ControlClient,
    app_dir: AppDir,
    *,
    environment: BuildEnvironment | None = None,
    canary: int = 0,
    ramp: float = 0.0,
    keep_split: bool = False,
    pause: Pause = time.sleep,
) -> int:
    """`app_dir` built here, its image sent or pushed, then deployed (`canary`: its share
    beside the active version); the rollout followed."""
    environment = environment or BuildEnvironment()
    built = built_here(app_dir, environment)
    definition = app_dir.definition
    if built.pushed is not None:
        definition = pushed_definition(app_dir, built.pushed)
        report = api.start_deploy(
            definition.model_dump(mode="json"),
            None,
            made=built.made,
            canary=canary,
            ramp=ramp,
            keep_split=keep_split,
        )
        return follow_rollout(api, report, pause)
    assert built.layout is not None and built.manifest is not None
    started = time.monotonic()
    try:
        sent = upload(api, built.layout, built.manifest, definition.spec.image or "")
    except (ImageError, ValueError, OSError) as exc:
        raise CliError(f"cannot send the image built from {app_dir.path}: {exc}", RUNTIME) from exc
    had = sent.blobs - sent.sent
    took, copied = built.seconds
    say(
        f"built {built_line(built.manifest, built.builder, took, copied)}; sent {sent.sent} of "
        f"its {sent.blobs} blobs ({sent.bytes / 1e6:.1f} MB) in {time.monotonic() - started:.1f} s"
        + (f", the control plane had the other {had}" if had else "")
    )
    report = api.start_deploy(
        definition.model_dump(mode="json"),
        None,
        image_manifest=built.manifest,
        made=built.made,
        canary=canary,
        ramp=ramp,
        keep_split=keep_split,
    )
    return follow_rollout(api, report, pause)


def built_here(app_dir: AppDir, environment: BuildEnvironment) -> Built:
    """`app_dir` built where this command runs, the builder's output shown as it comes."""
    say(f"building {app_dir.definition.name} ({app_dir.plan.made})")
    try:
        built = build(app_dir, environment, lambda line: say(f"  | {line}"))
    except BuildFailed as exc:
        last = "\n".join(exc.last)
        raise CliError(f"{exc}; nothing was deployed. Its last lines:\n{last}", RUNTIME) from exc
    except (BuilderError, ContextRefused, ImageError, ValueError, OSError) as exc:
        raise CliError(f"cannot build {app_dir.path}: {exc}", RUNTIME) from exc
    if built.pushed is not None:
        say(f"pushed {built.pushed}")
    return built


def pushed_definition(app_dir: AppDir, pushed: str) -> AppDefinition:
    """The app's definition, running the image a build pushed (`REPOSITORY@sha256:...`)."""
    definition = app_dir.definition
    spec = definition.spec.model_copy(update={"image": pushed})
    return definition.model_copy(update={"spec": spec})


def build_for_up(app_dir: AppDir, environment: BuildEnvironment | None = None) -> AppDir:
    """`wakeful up APP_DIR` of a directory to build: built before the control plane starts,
    the result for its in-process deploy to import (`AppDir.prebuilt`)."""
    if app_dir.plan.kind not in BUILT_KINDS:
        return app_dir
    built = built_here(app_dir, environment or BuildEnvironment())
    if built.pushed is not None:
        definition = pushed_definition(app_dir, built.pushed)
        return dataclasses.replace(app_dir, definition=definition, made=built.made)
    assert built.layout is not None and built.manifest is not None
    took, copied = built.seconds
    say(f"built {built_line(built.manifest, built.builder, took, copied)}")
    prebuilt = Prebuilt(built.layout, built.manifest)
    return dataclasses.replace(app_dir, prebuilt=prebuilt, made=built.made)


def built_line(manifest: str, builder: str, took: float, copied: float) -> str:
    """What a build made, how and how long it took (and its copy into the build cache)."""
    return f"{manifest[:19]} with {builder} in {took:.1f} s (copied out in {copied:.1f} s)"


def as_typed(command: Sequence[str]) -> str:
    """A command as a person would type it: quoted only where a shell needs it, `$PORT` and
    `$HOST` left as they are (wakeful replaces them, no shell does)."""
    return " ".join(
        word if re.fullmatch(r"[A-Za-z0-9_@%+=:,./${}-]+", word) else shlex.quote(word)
        for word in command
    )


def dry_run(app_dir: AppDir) -> int:
    """What `deploy` would build and run for `app_dir`, with nothing built or sent."""
    plan, spec = app_dir.plan, app_dir.definition.spec
    if plan.kind not in BUILT_KINDS:
        if spec.image is not None:
            say(f"runs the image {spec.image} (nothing to build)")
        else:
            runs = as_typed(spec.command)
            say(f"{app_dir.path}: a directory app (nothing to build); runs {runs}")
        return 0
    try:
        text = containerfile_of(app_dir)
    except OSError as exc:
        raise CliError(f"cannot read {app_dir.path / (plan.containerfile or '')}: {exc}") from exc
    say(f"# {app_dir.path}: built from {plan.made}")
    say(text.rstrip("\n"))
    if spec.command:
        say(f"# runs (wakeful.toml's command): {as_typed(spec.command)}")
    elif plan.start is not None:
        say(f"# runs: {plan.start}")
    else:
        say("# runs: the image's ENTRYPOINT and CMD")
    return 0
