"""An image's checked layers made into a tree: umoci unpacks, then one walk settles the tree.

umoci runs with `--rootless` even as root: it then never creates a device node (it writes an
empty file in its place), never chowns (the tree is the agent's), and records a non-root
owner in the `user.rootlesscontainers` xattr (a small protobuf: uid is field 1, gid field 2).
It resolves every path, symlinks included, inside the root.

The walk (`settle`, blocking: run it in a thread) then makes the tree safe to hand a sandbox:

- no setuid or setgid bit, no `security.capability` xattr (file capabilities);
- no FIFO, socket or device node (whatever made one, it is removed);
- nothing writable by group or others (the sandbox binds it read-only as well);
- with an `owner` (the app's uid, on a root node): what the image's user owns becomes the
  owner's (uid and gid). The image's user is its config's `User`: empty, `root` or `0` own
  every file; another (`1000`, `1000:100`, `www`, looked up in the tree's `/etc/passwd`) owns
  the files the xattr says are its, and the rest stay root's.

It returns the tree's size: its regular files' bytes, each inode once.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from wakeful.aio.spawn import run_tool

from .errors import ImageError

ROOTLESS_XATTR = "user.rootlesscontainers"
CAPABILITY_XATTR = "security.capability"
NOOP_ID = 0xFFFFFFFF
"""What the rootlesscontainers record writes for an id it leaves unchanged (root's)."""
ROOT_USERS = frozenset({"", "root", "0"})
MAX_PASSWD = 1 << 20


def umoci_path() -> str:
    found = shutil.which("umoci")
    if found is None:
        raise ImageError(
            "cannot be unpacked: umoci is not installed on this node (install Debian's "
            "`umoci` package: apt-get install umoci)"
        )
    return found


async def run_umoci(layout: Path, ref: str, rootfs: Path) -> None:
    """`umoci raw unpack --rootless` the image `ref` of `layout` into `rootfs` (which must not
    exist yet); `ImageError` with umoci's own last words when it fails."""
    umoci = umoci_path()
    argv = [umoci, "raw", "unpack", "--rootless", "--image", f"{layout}:{ref}", str(rootfs)]
    done = await run_tool(argv)
    if done.returncode != 0:
        raise ImageError(f"could not be unpacked by umoci: {done.last_line()}")


def rootless_ids(record: bytes) -> tuple[int | None, int | None]:
    """The (uid, gid) a `user.rootlesscontainers` xattr records; None for an id it leaves
    root's (absent, or `NOOP_ID`). Fields other than 1 and 2 are skipped (pure)."""
    ids: dict[int, int] = {}
    position = 0
    while position < len(record):
        key, position = _varint(record, position)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, position = _varint(record, position)
            ids[field] = value
        elif wire == 2:
            length, position = _varint(record, position)
            position += length
        elif wire in (1, 5):
            position += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire} in a rootlesscontainers record")
    uid, gid = ids.get(1), ids.get(2)
    return (None if uid in (None, NOOP_ID) else uid), (None if gid in (None, NOOP_ID) else gid)


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("a truncated varint in a rootlesscontainers record")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def image_uid(user: str, passwd: str | None) -> int:
    """The uid the image's config `User` names (pure): 0 for root, the number of `1000` or
    `1000:100`, a name's uid in the image's `/etc/passwd` text (None: the image has none)."""
    name = user.partition(":")[0]
    if name in ROOT_USERS:
        return 0
    if name.isdigit():
        return int(name)
    for line in (passwd or "").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] == name and fields[2].isdigit():
            return int(fields[2])
    where = "its /etc/passwd" if passwd is not None else "it (it has no /etc/passwd)"
    raise ImageError(f'runs as user "{name}", who is not in {where}')


def read_passwd(rootfs: Path) -> str | None:
    """The tree's `/etc/passwd` text; None when there is none. Never followed out of the
    tree: a symlink in the way counts as no file."""
    current = rootfs
    for part in ("etc", "passwd"):
        current = current / part
        if current.is_symlink() or not current.exists():
            return None
    if not current.is_file() or current.stat().st_size > MAX_PASSWD:
        return None
    return current.read_text(errors="replace")


def settle(rootfs: Path, owner: int | None, user: str) -> int:
    """Make the unpacked `rootfs` safe and `owner`'s as the module says; its size in bytes."""
    image_user = 0 if owner is None else image_uid(user, read_passwd(rootfs))
    size = 0
    seen: set[int] = set()
    _fix(rootfs, os.lstat(rootfs), owner, image_user)
    for top, dirs, files in os.walk(rootfs):
        for name in dirs + files:
            path = os.path.join(top, name)
            found = os.lstat(path)
            if stat.S_ISREG(found.st_mode) and found.st_ino not in seen:
                seen.add(found.st_ino)
                size += found.st_size
            _fix(path, found, owner, image_user)
    return size


def _fix(path: str | Path, found: os.stat_result, owner: int | None, image_user: int) -> None:
    mode = found.st_mode
    if stat.S_ISLNK(mode):
        if owner is not None and _owned_by(path, image_user):
            os.chown(path, owner, owner, follow_symlinks=False)
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        os.unlink(path)  # a FIFO, socket or device node: never in a tree
        return
    if CAPABILITY_XATTR in os.listxattr(path, follow_symlinks=False):
        os.removexattr(path, CAPABILITY_XATTR, follow_symlinks=False)
    if owner is not None and _owned_by(path, image_user):
        os.chown(path, owner, owner, follow_symlinks=False)
    bits = stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH)
    if bits != stat.S_IMODE(mode) or owner is not None:  # chown may have cleared bits too
        os.chmod(path, bits)


def _owned_by(path: str | Path, uid: int) -> bool:
    """Whether the image's tar gave `path` to `uid` (umoci's record; no record: root)."""
    if uid == 0:
        return True
    try:
        record = os.getxattr(path, ROOTLESS_XATTR, follow_symlinks=False)
    except OSError:
        return False  # no record: root's in the image
    try:
        recorded, _ = rootless_ids(record)
    except ValueError:
        return False
    return recorded == uid
