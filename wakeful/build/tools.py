"""The image builders a CLI may find where it runs: podman, buildah or docker, through one
narrow surface (`Builder`): build a Containerfile into a local image, copy that image into an
OCI image layout (what the upload reads), push it to a registry, forget an old build.

Build output streams to the caller line by line (`out`); a failed build raises `BuildFailed`
with its last lines. The builder's own errors become `BuilderError`s here, at the boundary.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from wakeful.oci import ImageStorageError, layout
from wakeful.oci.archives import open_archive

BUILDERS = ("podman", "buildah", "docker")
LAST_LINES = 10
"""Lines of a failed build's output its error repeats (all of it was shown as it came)."""
MAX_LINE = 8192
"""Bytes of one line of build output kept (the rest of a longer one is dropped)."""
EXPORT_TIMEOUT = 900.0
Out = Callable[[str], None]


class BuilderError(Exception):
    """A builder is missing, or one of its steps failed: the message says which and why."""


class BuildFailed(BuilderError):
    """The build itself failed; `last` holds its last lines of output."""

    def __init__(self, message: str, last: Sequence[str]) -> None:
        super().__init__(message)
        self.last = list(last)


def bounded_lines(stream: IO[bytes], limit: int = MAX_LINE) -> Iterator[str]:
    """The lines of `stream`, each cut to `limit` bytes (the rest of a longer one is read and
    dropped, never held): a build's output cannot grow the CLI's memory."""
    while chunk := stream.readline(limit):
        if chunk.endswith(b"\n"):
            yield chunk[:-1].decode("utf-8", errors="replace")
            continue
        cut = chunk.decode("utf-8", errors="replace")
        if len(chunk) == limit:
            while (more := stream.readline(limit)) and not more.endswith(b"\n"):
                pass
        yield cut + (" [line cut]" if len(chunk) == limit else "")


def build_command(
    tool: str,
    containerfile: Path,
    tag: str,
    ignorefile: Path | None,
    ca: Path | None,
    labels: Sequence[str],
) -> tuple[list[str], dict[str, str]]:
    """The argv (the context still to add) and the environment `tool` builds with: buildah
    keeps layers only when asked; docker reads no --ignorefile (it finds
    `<Containerfile>.dockerignore` beside the Containerfile) and takes --secret only with
    BuildKit."""
    argv = [tool, "build", *(["--layers"] if tool == "buildah" else [])]
    argv += ["-f", str(containerfile), "-t", tag]
    if ca is not None:
        argv += ["--secret", f"id=extra_ca,src={ca}"]
    if ignorefile is not None and tool != "docker":
        argv += ["--ignorefile", str(ignorefile)]
    for label in labels:
        argv += ["--label", label]
    return argv, ({"DOCKER_BUILDKIT": "1"} if tool == "docker" else {})


RACED_ATTEMPTS = 3
RACED_PAUSE = 1.0
"""Seconds, times 1 to 3 at random, a raced build waits before it runs again, doubling: the
other's removals (a `wakeful deploy` of another app, a clean-up) have a moment to end."""
RACED_WORDS = "an image was removed from the builder's storage while the build read its cache"


@dataclass(frozen=True)
class Ended:
    """How one run of a build ended: its exit code and last lines of output."""

    returncode: int
    lines: list[str]


def raced(ended: Ended) -> bool:
    """Whether a build failed only because another process removed an image meanwhile: podman
    and buildah look for cached layers through every image in their storage and fail the build
    when one vanishes under them ("getting top layer info: layer not known"); another build
    removing its old image, as every `wakeful deploy DIR` does, is enough. Nothing is broken:
    the same build run again lists the images anew."""
    return any("layer not known" in line for line in ended.lines[-2:])


def find_builder(chosen: str | None, which: Callable[[str], str | None] = shutil.which) -> str:
    """The builder to use: `chosen` (WAKEFUL_BUILDER) when set, else the first of podman,
    buildah and docker installed here."""
    if chosen:
        if chosen not in BUILDERS:
            raise BuilderError(f"WAKEFUL_BUILDER={chosen!r}: must be one of {', '.join(BUILDERS)}")
        if which(chosen) is None:
            raise BuilderError(f"WAKEFUL_BUILDER={chosen}: {chosen} is not installed here")
        return chosen
    for name in BUILDERS:
        if which(name) is not None:
            return name
    raise BuilderError(
        "no image builder here: install podman, buildah or docker to build this app "
        "(or set `image` in wakeful.toml to deploy an image built elsewhere)"
    )


@dataclass
class Builder:
    tool: str
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    wait: Callable[[float], None] = time.sleep
    """How a build that lost a race waits before it runs again (`raced`)."""

    def build(
        self,
        containerfile: Path,
        context: Path,
        tag: str,
        *,
        out: Out,
        ignorefile: Path | None = None,
        ca: Path | None = None,
        labels: Sequence[str] = (),
    ) -> None:
        """`containerfile` built with `context` into the local image `tag`, its output
        streamed to `out`; BuildFailed with its last lines."""
        argv, extra = build_command(self.tool, containerfile, tag, ignorefile, ca, labels)
        for attempt in range(1, RACED_ATTEMPTS + 1):
            last = self._build_once([*argv, str(context)], {**self.env, **extra}, out)
            if last.returncode == 0:
                return
            if attempt < RACED_ATTEMPTS and self.tool != "docker" and raced(last):
                pause = RACED_PAUSE * 2 ** (attempt - 1) * random.uniform(1, 3)
                out(f"wakeful: {RACED_WORDS}; building again in {pause:.1f} s")
                self.wait(pause)
                continue
            raise BuildFailed(f"{self.tool} build failed (exit {last.returncode})", last.lines)

    def _build_once(self, argv: list[str], env: dict[str, str], out: Out) -> Ended:
        """One run of the build, its output streamed to `out`; how it ended."""
        last: collections.deque[str] = collections.deque(maxlen=LAST_LINES)
        try:
            with subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            ) as process:
                assert process.stdout is not None
                for line in bounded_lines(process.stdout):
                    last.append(line)
                    out(line)
        except OSError as exc:
            raise BuilderError(f"{self.tool} build could not start: {exc}") from None
        return Ended(process.returncode, list(last))

    def export(self, tag: str, layout: Path, workspace: Path) -> str:
        """The image `tag` copied into the OCI image layout `layout` (named `latest`; blobs
        it holds already are not written again); the manifest's digest."""
        if self.tool == "docker":  # no OCI layout out of docker: its archive, read strictly
            return self._export_docker(tag, layout, workspace)
        skopeo = shutil.which("skopeo")
        if skopeo is not None:
            # Layers as the builder keeps them, uncompressed: a layer the layout holds already
            # is found by its digest and not written again (podman push compresses every layer
            # each time, ~3 s for a 300 MB image: the layout holds only compressed blobs, which
            # it cannot match).
            argv = [skopeo, "copy", "--quiet", "--dest-oci-accept-uncompressed-layers"]
            argv += [f"containers-storage:{tag}", f"oci:{layout}:latest"]
            run(self.env, argv, "skopeo copying the image out")
        else:
            self._run(["push", "--quiet", tag, f"oci:{layout}:latest"], "copying the image out")
        return layout_manifest(layout, "latest")

    def _export_docker(self, tag: str, layout: Path, workspace: Path) -> str:
        workspace.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=workspace) as scratch:
            archive = Path(scratch) / "image.tar"
            self._run(["save", "-o", str(archive), tag], "saving the image")
            opened = open_archive(archive, "docker-archive", Path(scratch), 1 << 40)
            shutil.rmtree(layout, ignore_errors=True)
            shutil.move(opened, layout)
        return layout_manifest(layout, None)

    def image_id(self, tag: str) -> str | None:
        """The local image `tag`'s id, or None when there is none."""
        if self.tool == "buildah":  # buildah has no `image inspect`
            args = ["inspect", "--type", "image", "--format", "{{.FromImageID}}", tag]
        else:
            args = ["image", "inspect", "--format", "{{.Id}}", tag]
        done = self._run(args, "", check=False)
        return done.stdout.strip() or None if done.returncode == 0 else None

    def remove(self, image_id: str) -> None:
        """An earlier build's image, when nothing else uses it (its shared layers stay)."""
        self._run(["rmi", image_id], "", check=False)

    def push(self, tag: str, destination: str) -> str:
        """`tag` pushed to the registry reference `destination`; the manifest's digest."""
        if self.tool == "docker":
            self._run(["tag", tag, destination], "tagging the image")
            done = self._run(["push", destination], f"pushing to {destination}")
            for word in done.stdout.split():
                if word.startswith("sha256:"):
                    return word
            raise BuilderError(f"docker push {destination}: no digest in its output")
        with tempfile.TemporaryDirectory() as scratch:
            digestfile = Path(scratch) / "digest"
            self._run(
                ["push", "--digestfile", str(digestfile), tag, f"docker://{destination}"],
                f"pushing to {destination}",
            )
            return digestfile.read_text().strip()

    def _run(
        self, args: list[str], what: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The builder run with `args` (`what` it does, for an error)."""
        return run(self.env, [self.tool, *args], f"{self.tool} {what}", check)


def run(
    env: dict[str, str], argv: list[str], what: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end (BuilderError naming `what` when it fails, with `check`)."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", env=env, timeout=EXPORT_TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuilderError(f"{what}: {exc}") from None
    if check and done.returncode != 0:
        raise BuilderError(f"{what} failed: {done.stderr.strip()[-2000:]}")
    return done


def layout_manifest(root: Path, name: str | None) -> str:
    """The digest of the manifest the layout's index.json names `name` (None: its only one)."""
    try:
        if name is not None:
            found = layout.tagged(root, name)
        else:
            entries = layout.read_index(root)
            found = entries[0].get("digest") if len(entries) == 1 else None
    except ImageStorageError as exc:
        raise BuilderError(f"the exported image: {exc}") from None
    if not isinstance(found, str):
        raise BuilderError(f"the exported image's index.json names no single manifest {name}")
    return found
