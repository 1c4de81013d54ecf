"""A build context checked before any builder reads it: it is hostile input like any upload.

The walk (never following a link) refuses what a builder would mishandle or what would leak the
building machine's files into an image: a symbolic link whose target leaves the directory (an
absolute one, or one that leads out once every link on its way is followed), anything that is
not a directory, a file or a link (a FIFO would hang the build, a device has no place in an
image), and a wakeful data directory (`.wakeful`, or any directory holding a `token` beside a
store or secrets keys: `wakeful up` run in an app's own directory keeps its admin token and
keys there); and it bounds the files and bytes a builder would send.

Paths the build leaves out are not walked, matched as the builder matches them (`.dockerignore`
rules: anchored at the context's top, `*` and `?` within one path segment, `**` across any
number of them, a pattern that matches a directory leaving out all under it): the directory's
own ignore file (for docker `.dockerignore` alone, which is all it reads; for podman and
buildah `.containerignore`, else `.dockerignore`), else a stack's defaults, which the build
passes on to the builder. An exception (`!pattern`) in the ignore file makes the walk count
everything: it never counts less than the builder sends.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".containerignore", ".dockerignore")
MAX_CONTEXT_BYTES = 1 << 30
MAX_CONTEXT_FILES = 100_000
MAX_IGNORE_BYTES = 1 << 20
DATA_DIR_NAME = ".wakeful"
DATA_DIR_MARKS = ("store.db", "secret-keys", "control.json")
"""Beside a `token` file, what makes a directory a wakeful data directory."""


class ContextRefused(ValueError):
    """The build context breaks a rule: the message names the path and the rule."""


@dataclass(frozen=True)
class ContextSize:
    files: int
    bytes: int


def ignore_files(tool: str, containerfile: str | None = None) -> tuple[str, ...]:
    """The ignore files `tool` reads, in its order: docker (BuildKit) prefers one named after
    the Containerfile it builds (`Dockerfile.prod.dockerignore`) to `.dockerignore`."""
    if tool == "docker":
        own = (f"{containerfile}.dockerignore",) if containerfile else ()
        return (*own, ".dockerignore")
    return IGNORE_FILES


def own_ignore_file(root: Path, tool: str, containerfile: str | None = None) -> Path | None:
    """The directory's ignore file that `tool` reads, if it has one."""
    for name in ignore_files(tool, containerfile):
        if os.path.lexists(root / name):
            return root / name
    return None


def ignore_patterns(
    root: Path, defaults: Sequence[str], tool: str = "podman", containerfile: str | None = None
) -> tuple[str, ...]:
    """The patterns the build leaves out: the directory's ignore file's (none when it has an
    exception), else `defaults`. The ignore file must be a regular file (not a link) of at most
    `MAX_IGNORE_BYTES`."""
    path = own_ignore_file(root, tool, containerfile)
    if path is None:
        return tuple(defaults)
    if not stat.S_ISREG(path.lstat().st_mode):
        raise ContextRefused(f"{path.name}: not a regular file (a link, say): it is read as is")
    with path.open("rb") as file:
        data = file.read(MAX_IGNORE_BYTES + 1)
    if len(data) > MAX_IGNORE_BYTES:
        raise ContextRefused(f"{path.name}: larger than {MAX_IGNORE_BYTES} bytes")
    lines = [line.strip() for line in data.decode("utf-8", errors="replace").splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    if any(pattern.startswith("!") for pattern in patterns):
        return ()
    return tuple(cleaned for cleaned in map(_clean, patterns) if cleaned)


def _clean(pattern: str) -> str:
    pattern = pattern.strip("/")
    while pattern.startswith("./"):
        pattern = pattern[2:]
    return "" if pattern == "." else pattern


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A `.dockerignore` pattern as a regular expression over a context-relative path."""
    out, i = ["^"], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                out.append("(?:.*/)?")
                i += 1
            else:
                out.append(".*")
            continue
        char = pattern[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    out.append("$")
    return re.compile("".join(out))


def _ignored(relative: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    """Whether the builder leaves `relative` out: a pattern matches it or a directory above."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(pattern.match(prefix) for pattern in patterns for prefix in prefixes)


def check_context(
    root: Path,
    patterns: Sequence[str] = (),
    *,
    max_bytes: int = MAX_CONTEXT_BYTES,
    max_files: int = MAX_CONTEXT_FILES,
) -> ContextSize:
    """The context's size, once every entry under `root` not matched by `patterns` passed the
    module's rules; ContextRefused otherwise."""
    root = root.resolve()
    compiled = [pattern_regex(pattern) for pattern in patterns]
    files = size = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        _refuse_data_dir(root, folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                path = Path(entry.path)
                relative = path.relative_to(root).as_posix()
                if _ignored(relative, compiled):
                    continue
                mode = entry.stat(follow_symlinks=False).st_mode
                files += 1
                if files > max_files:
                    raise ContextRefused(
                        f"the build context has more than {max_files} files "
                        "(WAKEFUL_BUILD_MAX_FILES; leave some out with a .containerignore)"
                    )
                if stat.S_ISDIR(mode):
                    stack.append(path)
                elif stat.S_ISLNK(mode):
                    _check_link(root, path, relative)
                elif stat.S_ISREG(mode):
                    size += entry.stat(follow_symlinks=False).st_size
                    if size > max_bytes:
                        raise ContextRefused(
                            f"the build context is larger than {max_bytes} bytes at {relative!r} "
                            "(WAKEFUL_BUILD_MAX_CONTEXT; leave some out with a .containerignore)"
                        )
                else:
                    raise ContextRefused(
                        f"{relative!r}: not a file, a directory or a link (a FIFO, socket or "
                        "device has no place in a build context)"
                    )
    return ContextSize(files, size)


def _refuse_data_dir(root: Path, folder: Path) -> None:
    marks = [mark for mark in DATA_DIR_MARKS if os.path.lexists(folder / mark)]
    if folder.name == DATA_DIR_NAME or (os.path.lexists(folder / "token") and marks):
        relative = folder.relative_to(root).as_posix()
        raise ContextRefused(
            f"{relative!r} is a wakeful data directory (its admin token, store and secrets "
            "keys would go into the image): run `wakeful up` elsewhere (--data-dir), or leave "
            "it out with a .containerignore"
        )


def _check_link(root: Path, path: Path, relative: str) -> None:
    target = os.readlink(path)
    if os.path.isabs(target):
        raise ContextRefused(
            f"{relative!r}: a link to {target!r}, outside the app directory (leave it out with "
            "a .containerignore, or copy what it points at into the directory)"
        )
    # Every link on the way followed (`d -> .` then `e -> d/../secret` leaves the directory,
    # which a lexical look would miss).
    if not Path(os.path.realpath(path)).is_relative_to(root):
        raise ContextRefused(
            f"{relative!r}: a link to {target!r}, which leads out of the app directory"
        )
