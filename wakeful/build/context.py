"""A build context checked before any builder reads it: it is hostile input like any upload.

The walk (never following a link) refuses what a builder would mishandle or what would leak the
building machine's files into an image: a symbolic link whose target leaves the directory (an
absolute one, or one that climbs out), and anything that is not a directory, a file or a link
(a FIFO would hang the build, a device has no place in an image); and it bounds the files and
bytes a builder would send. Paths the build leaves out are not walked: the directory's own
`.containerignore` or `.dockerignore` patterns (a `!` exception in it makes the walk count
everything: it never counts less than the builder sends), else a stack build's defaults.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".containerignore", ".dockerignore")
MAX_CONTEXT_BYTES = 1 << 30
MAX_CONTEXT_FILES = 100_000


class ContextRefused(ValueError):
    """The build context breaks a rule: the message names the path and the rule."""


@dataclass(frozen=True)
class ContextSize:
    files: int
    bytes: int


def ignore_patterns(root: Path, defaults: Sequence[str]) -> tuple[str, ...]:
    """The patterns the walk skips: the directory's ignore file's (none when it has an
    exception), else `defaults`."""
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
            patterns = [line for line in lines if line and not line.startswith("#")]
            if any(pattern.startswith("!") for pattern in patterns):
                return ()
            return tuple(pattern.strip("/") for pattern in patterns)
    return tuple(defaults)


def _ignored(relative: str, patterns: Sequence[str]) -> bool:
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatchcase(prefix, pattern) or fnmatch.fnmatchcase(parts[-1], pattern)
        for pattern in patterns
        for prefix in prefixes
    )


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
    files = size = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                path = Path(entry.path)
                relative = path.relative_to(root).as_posix()
                if _ignored(relative, patterns):
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
                            f"the build context is larger than {max_bytes} bytes at {relative} "
                            "(WAKEFUL_BUILD_MAX_CONTEXT; leave some out with a .containerignore)"
                        )
                else:
                    raise ContextRefused(
                        f"{relative}: not a file, a directory or a link (a FIFO, socket or "
                        "device has no place in a build context)"
                    )
    return ContextSize(files, size)


def _check_link(root: Path, path: Path, relative: str) -> None:
    target = os.readlink(path)
    if os.path.isabs(target):
        raise ContextRefused(
            f"{relative}: a link to {target}, outside the app directory (leave it out with a "
            ".containerignore, or copy what it points at into the directory)"
        )
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    if not Path(resolved).is_relative_to(root):
        raise ContextRefused(
            f"{relative}: a link to {target}, which leads out of the app directory"
        )
