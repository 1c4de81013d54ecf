"""A sandbox's writable tree, bounded: one tmpfs of the app's `disk` size holding its `/app`,
`/tmp` and `/dev/shm`, and the account files that name its uid (root only). Everything a sandbox
can write lives there, so it can never fill the node's disk."""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Callable
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)


SCRATCH = ("tmp", "shm")
"""Bound at the sandbox's `/tmp` and `/dev/shm`, beside `app` (its `/app`); like `app`, 0700
and the app's own once filled (every process of a sandbox runs as its app's uid, so nothing
there needs to be open to others, in the sandbox or on the node)."""
MS_NOSUID, MS_NODEV, MS_REMOUNT = 2, 4, 32


def mount_sandbox_fs(root: Path, size: int) -> None:
    """Make `root` a tmpfs of `size` bytes (root only) holding `app/` and the `SCRATCH`
    directories (root's, 0700, until `fill_app_dir`): everything a sandbox can write lives there,
    and it can never fill the node's disk. Its own root is never visible inside."""
    root.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700".encode()
    if _libc.mount(b"tmpfs", str(root).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs on {root}: {os.strerror(err)}")
    try:
        for name in ("app", *SCRATCH):
            (root / name).mkdir(mode=0o700)
        for name in ACCOUNTS:  # root's, 0600, until `fill_app_dir` gives them to the app
            os.close(os.open(root / name, os.O_WRONLY | os.O_CREAT, 0o600))
    except BaseException:
        unmount(root)
        raise


ACCOUNTS = ("passwd", "group")
"""Files beside `app/`, bound read-only at the sandbox's /etc/passwd and /etc/group: the app's
uid has a name (`app`) and a home (`/app`), so `getpwuid`, `whoami` and `~` work for it, the
lookup ends in the file instead of loading another NSS module, and the host's accounts are not
listed to it."""


def accounts(uid: int) -> dict[str, str]:
    return {
        "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"app:x:{uid}:{uid}:app:/app:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\napp:x:{uid}:\nnogroup:x:65534:\n",
    }


def resize_sandbox_fs(root: Path, size: int) -> None:
    """Give the tmpfs of `mount_sandbox_fs` a new size (what a warm slot's becomes the app's)."""
    options = f"size={size}".encode()
    flags = MS_REMOUNT | MS_NOSUID | MS_NODEV
    if _libc.mount(b"tmpfs", str(root).encode(), b"tmpfs", flags, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot resize the tmpfs on {root}: {os.strerror(err)}")


def fill_app_dir(root: Path, uid: int, place: Callable[[Path, int], None]) -> None:
    """Have `place` write the app into the tmpfs's (empty) `app/`, all of it owned by `uid`,
    give `uid` that directory and the scratch ones, and name it in the sandbox's accounts."""
    app = root / "app"
    place(app, uid)
    os.chown(app, uid, uid)
    for name in SCRATCH:
        os.chown(root / name, uid, uid)
    for name, text in accounts(uid).items():
        with open(root / name, "r+") as file:  # in place: the sandbox has this inode bound
            file.write(text)
            file.truncate()
        # The app's own (bound read-only, so it cannot change them): readable by it whatever
        # the agent's umask (077 in a data directory made them 0600, and getpwuid, whoami
        # and ~ failed), and by nobody else.
        os.chown(root / name, uid, uid)


IMAGE_MOUNTS = ("proc", "dev", "tmp", "etc")
"""Where bwrap mounts something in an image's root (its own /proc, /dev and /tmp, and the
files of `IMAGE_FILES` in /etc): made real directories in its overlay, whatever the image has
there. bwrap, as root, creates a mount's target before it binds over it, and resolves the path
after its pivot_root, where the node's own root is `/oldroot`: an image's `etc ->
/oldroot/some/dir` made it create files on the node (found by a review)."""
IMAGE_FILES = ("etc/hosts", "etc/resolv.conf")
"""Bound read-only over the image's own by bwrap: each left a regular file, or nothing."""


def mount_image_root(tree: Path, lower: Path) -> Path:
    """An overlay of the cached, read-only image tree `lower` with a writable upper layer in
    the sandbox's tmpfs `tree` (`mount_sandbox_fs`: so the app's writes are bounded by its
    `disk`), at `tree/root`. Root only; undone with the tmpfs (`unmount` detaches both)."""
    for name in ("upper", "work", "root"):
        (tree / name).mkdir(mode=0o700)
    # The merged root takes the upper layer's owner and mode: the tree's owner, and 0755 as
    # every root directory is (whatever the agent's umask or the cache made of it), or an app
    # whose image user is not root could not even look up /proc.
    below = lower.stat()
    os.chown(tree / "upper", below.st_uid, below.st_gid)
    os.chmod(tree / "upper", 0o755)
    root = tree / "root"
    options = f"lowerdir={lower},upperdir={tree / 'upper'},workdir={tree / 'work'}"
    if (
        _libc.mount(
            b"overlay", str(root).encode(), b"overlay", MS_NOSUID | MS_NODEV, options.encode()
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount the image's overlay on {root}: {os.strerror(err)}")
    for name in IMAGE_MOUNTS:
        path = root / name
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()  # the link itself (or a file), in the upper layer
        path.mkdir(exist_ok=True)
        os.chmod(path, 0o755)  # covered by its mount; 0755 whatever the umask
    for name in IMAGE_FILES:  # in the real /etc made above: no link on the way
        path = root / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)  # never follows a link inside
            else:
                path.unlink()
    return root


def unmount(path: Path) -> None:
    """Undo `mount_sandbox_fs` (lazily: a process still holding a file there goes on)."""
    mnt_detach = 2
    _libc.umount2(str(path).encode(), mnt_detach)


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, uid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def unmount_under(root: Path) -> list[str]:
    """Detach every mount below `root` (from /proc/self/mounts); the mount points it undid."""
    prefix = str(root.resolve()) + "/"
    try:
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts]
    except OSError:
        return []
    undone = []
    for point in sorted(points, key=len, reverse=True):  # deepest first
        decoded = point.encode().decode("unicode_escape")  # /proc escapes spaces as \040
        if decoded.startswith(prefix):
            unmount(Path(decoded))
            undone.append(decoded)
    return undone
