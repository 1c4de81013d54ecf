"""What every stack shares: the plan a directory gets, the `[build]` choices it is made
from, and the pieces of a generated Containerfile (the start command, the base, versions read
from files, the build secret `extra_ca`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["image", "directory", "containerfile", "stack"]
Read = Callable[[str], str | None]
"""The text of a file at the top of the directory, or None when there is none."""

CONTAINERFILES = ("Containerfile", "Dockerfile")
BUILT_KINDS: tuple[Kind, ...] = ("containerfile", "stack")
"""The kinds of directory that are built."""
LEFT_OUT = ("**/.git", "**/.wakeful")
"""What every stack build leaves out of its context when the directory has no ignore file
(patterns as `.dockerignore` reads them): version control, and a `wakeful up` data directory."""
PORT = 8080
"""The port a stack image listens on when nothing passes PORT (`podman run` by hand); under
wakeful, PORT is always set."""
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CA = (
    "--mount=type=secret,id=extra_ca "
    "if [ -s /run/secrets/extra_ca ]; then export {variable}=/run/secrets/extra_ca; fi; "
)
"""A RUN step's start that exports the build secret `extra_ca` (a proxy's CA) to `variable`
for that step alone, when it was given."""
_VERSION = re.compile(r"^[ \t]*v?([0-9]+(?:\.[0-9]+)?)(?:\.[0-9]+)?[ \t]*$")


class PlanError(ValueError):
    """The directory cannot be built as it is: the message says what to add or change."""


@dataclass(frozen=True)
class Plan:
    """How a directory becomes what runs."""

    kind: Kind
    made: str
    """How the version is made, as `wakeful versions` shows it."""
    containerfile: str | None = None
    """The directory's own Containerfile (kind containerfile), a name at its top."""
    generated: str | None = None
    """The Containerfile a stack build generates (kind stack)."""
    start: str | None = None
    """The start command the generated image runs (a shell line), when one was found."""
    ignore: tuple[str, ...] = ()
    """What a stack build leaves out of its context when the directory has no ignore file."""


@dataclass(frozen=True)
class BuildChoice:
    """`[build]` in wakeful.toml, and what else of the manifest decides the plan."""

    enabled: bool = True
    base: str | None = None
    containerfile: str | None = None
    image: bool = False
    command: tuple[str, ...] = ()


def procfile_web(read: Read) -> str | None:
    """A Procfile's `web:` command, or None."""
    text = read("Procfile")
    if text is None:
        return None
    for line in text.splitlines():
        kind, sep, command = line.partition(":")
        if sep and kind.strip() == "web" and command.strip():
            return command.strip()
    return None


def start_line(
    read: Read, choice: BuildChoice, convention: str | None, stack: str, hint: str
) -> str | None:
    """The shell line the image starts with; None when wakeful.toml's `command` says."""
    if choice.command:
        return None
    found = procfile_web(read) or convention
    if found is None:
        raise PlanError(
            f"no start command for this {stack} app: {hint}; set `command` in wakeful.toml "
            "or add a Procfile with a `web:` line"
        )
    return found


def cmd(start: str | None, choice: BuildChoice) -> str:
    """The image's `CMD`: wakeful.toml's `command` in the exec form (what wakeful runs, its
    `$PORT` and `$HOST` replaced), else the start line under `sh -c` (a Procfile line is a
    shell line; `exec` leaves the app the process that gets the signals)."""
    if start is None:
        return "CMD " + json.dumps(list(choice.command)) + "\n"
    return "CMD " + json.dumps(["/bin/sh", "-c", f"exec {start}"]) + "\n"


def base_of(choice: BuildChoice, pattern: str, version: str) -> str:
    return choice.base or pattern.format(version=version)


def version_file(read: Read, names: tuple[str, ...], default: str) -> str:
    for name in names:
        text = read(name)
        if text is not None:
            found = _VERSION.match(text.strip().splitlines()[0] if text.strip() else "")
            if found is None:
                raise PlanError(f"{name}: {text.strip()[:40]!r} is not a version like 3.12")
            return found.group(1)
    return default
