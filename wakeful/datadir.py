"""The data directory is private: the store, the token, artifacts and sandbox output are the
control plane's alone.

`private_data_dir` runs once at the start of each process that writes into a data directory
(`wakeful up`, `wakeful activator`, `wakeful node`; see `wakeful.together`), in those that run
a node agent once they hold the directory (`held_data_dir`: a second `wakeful up` on it is
refused before it changes anything of the first's). It sets the process's umask to 077, so
every file and directory created from then on (SQLite's `-wal` and `-shm`, sandbox logs,
artifacts, whatever a library opens) is 0600 or 0700 whoever creates it; sandboxes inherit that
umask. Then it makes the directory 0700: created so when missing, tightened when it exists and
is ours (with a log line), and so are the files and directories in it that are ours, so a data
directory from an older wakeful is no longer readable by others. Sandbox trees (`sandboxes/`)
are left alone: each is recreated for each sandbox, and they may belong to the sandbox's own
uid; so are the image cache's trees (`images/`), whose modes are their images'.

The token file and `control.json` are also written here, each created 0600. The token file
bootstraps the admin token of `wakeful up` (see `wakeful.activator.credentials`) and is
rewritten when it is rotated (`write_token`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL_FILE = "control.json"
PRIVATE_UMASK = 0o077
SKIPPED = frozenset({"sandboxes", "images"})
"""Top-level entries not tightened: each sandbox's tree is made fresh when it starts, and the
node's image cache holds root filesystems whose modes are their images' (an agent removes what
a previous run left there at its first use, `wakeful.node.images.cache`): both are reached
only through the data directory itself, 0700."""


def private_umask() -> None:
    """Umask 077 for this process: what it creates from now on is its own alone. First thing,
    before a process that holds its data directory (`held_data_dir`) writes its lock there."""
    os.umask(PRIVATE_UMASK)


def private_data_dir(data_dir: Path) -> Path:
    """Umask 077 for this process, then `data_dir` made (or tightened to) 0700."""
    private_umask()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tighten_data_dir(data_dir)
    return data_dir


def tighten_data_dir(data_dir: Path) -> list[Path]:
    """Take group and other permissions off `data_dir` and everything in it that we own
    (except sandbox trees); returns what changed. Logged: as a warning when files were in
    it (they were readable by others until now), at INFO for an empty directory."""
    changed = []
    if _tighten(data_dir):
        changed.append(data_dir)
    for root, dirs, files in os.walk(data_dir):
        if Path(root) == data_dir:
            dirs[:] = [d for d in dirs if d not in SKIPPED]
        for name in dirs + files:
            path = Path(root) / name
            if _tighten(path):
                changed.append(path)
    info = data_dir.stat()
    if info.st_uid != os.geteuid() and info.st_mode & 0o077:
        log.warning(
            "data directory %s is mode %o and belongs to uid %d, not to this process (uid "
            "%d): left as it is, so other users may read what is in it",
            data_dir,
            stat.S_IMODE(info.st_mode),
            info.st_uid,
            os.geteuid(),
        )
    if changed:
        exposed = [p for p in changed if p != data_dir]
        level = logging.WARNING if exposed or any(data_dir.iterdir()) else logging.INFO
        log.log(
            level,
            "data directory %s was readable by other users: made it and %d file(s) in it "
            "private (0700 directories, 0600 files)",
            data_dir,
            len(exposed),
        )
    return changed


def _tighten(path: Path) -> bool:
    """Group/other bits off `path` when it is ours and not a link; True if it changed."""
    info = path.lstat()
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid() or not mode & 0o077:
        return False
    path.chmod(mode & 0o700)
    return True


def load_or_create_token(data_dir: Path) -> str:
    """The control API's bearer token, in `<data-dir>/token` (0600), made on first start."""
    path = data_dir / "token"
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(32)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def write_token(data_dir: Path, token: str) -> Path:
    """Replace `<data-dir>/token` (0600) in one rename: a reader sees the old or the new."""
    path = data_dir / "token"
    fresh = data_dir / ".token.new"
    with contextlib.suppress(FileNotFoundError):
        fresh.unlink()
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.replace(fresh, path)
    return path


def write_control_file(data_dir: Path, api_url: str, token: str, ingress_url: str | None) -> None:
    """`<data-dir>/control.json` (0600): where the other commands find `wakeful up`."""
    path = data_dir / CONTROL_FILE
    fresh = data_dir / f".{CONTROL_FILE}.new"
    with contextlib.suppress(FileNotFoundError):
        fresh.unlink()
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(
            {"api": api_url, "token": token, "ingress": ingress_url, "pid": os.getpid()}, handle
        )
    os.replace(fresh, path)  # a reader sees the old file or the new one, never half of one


def remove_control_file(data_dir: Path) -> None:
    """`wakeful up` stopped: the other commands no longer find it."""
    with contextlib.suppress(FileNotFoundError):
        (data_dir / CONTROL_FILE).unlink()
