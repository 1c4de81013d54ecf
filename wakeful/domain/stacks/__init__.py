"""What an app directory is, and the build a detected stack gets: pure functions of the
directory's top-level names and the text of a few of its files.

The order (`plan`): `image` in wakeful.toml runs that image, with no build; `[build] enabled =
false` keeps a plain directory app; a Containerfile (`[build] containerfile`, else
`Containerfile`, else `Dockerfile`) is built as written; a stack file is a stack build (Python:
`requirements.txt` or `pyproject.toml`; then Node: `package.json`; then Go: `go.mod`);
anything else is a directory app, whose `command` is required as before.

A stack build is a generated Containerfile: the stack's base image, the dependencies installed
in a layer of their own keyed on the file that lists them (so a change to the code alone reuses
it), then the code, and the start command as its `CMD`. The start command is wakeful.toml's
`command` when given (it overrides the image's `CMD` at every start anyway), else a Procfile's
`web:` line, else the stack's convention; none found is refused with what was looked for.
A CA the build needs to reach a package index (a proxy's) comes as the build secret
`extra_ca`, mounted for the install step alone: it never lands in a layer.
"""

from __future__ import annotations

from .common import (
    BUILT_KINDS,
    CONTAINERFILES,
    PORT,
    BuildChoice,
    Kind,
    Plan,
    PlanError,
    Read,
    procfile_web,
)
from .go import go
from .node import node
from .python import python

__all__ = [
    "BUILT_KINDS",
    "CONTAINERFILES",
    "PORT",
    "BuildChoice",
    "Kind",
    "Plan",
    "PlanError",
    "Read",
    "plan",
    "procfile_web",
]


def plan(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan:
    """What the directory with the top-level `names` is (see the module's order)."""
    if choice.image:
        return Plan("image", "image")
    if not choice.enabled:
        return Plan("directory", "directory")
    if choice.containerfile is not None:
        if choice.containerfile not in names:
            raise PlanError(
                f"build.containerfile: {choice.containerfile!r} is not a file at the top of "
                "the app directory"
            )
        return Plan("containerfile", choice.containerfile, containerfile=choice.containerfile)
    for name in CONTAINERFILES:
        if name in names:
            return Plan("containerfile", name, containerfile=name)
    for stack in (python, node, go):
        found = stack(names, read, choice)
        if found is not None:
            return found
    return Plan("directory", "directory")
