"""The key directory's files: one `<id>.key` of 32 random bytes per key, in a directory only
the control plane may read (`KeyRing` keeps them in memory and says which is current).

- The directory is made 0700; one open to other users (group or world bits), or a key file
  that is, is refused with one line, as ssh refuses a private key others can read.
- A key is written under a temporary name (O_EXCL), fsynced, then linked into place: a
  reader never sees half a key, and no key is ever overwritten.
- A key file is read only if it is a regular file, opened without blocking (a FIFO put in a
  key's place would hang the event loop in `open`, past SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakeful.domain.models import KEY_ID_PATTERN

from .errors import KeysUnusable

SUFFIX = ".key"
KEY_FILE = re.compile(KEY_ID_PATTERN.removesuffix("$") + re.escape(SUFFIX) + "$")


class KeyDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path

    def private(self) -> None:
        """The directory, made 0700 when absent; `KeysUnusable` when others may read it."""
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            _refuse_open(self.path, "secrets key directory", "700")
        except OSError as exc:
            raise KeysUnusable(
                f"{self.path}: cannot use it for secrets keys: {exc.strerror}"
            ) from None

    def read(self, key_id: str) -> bytes | None:
        """The key file's bytes (their size is checked by whoever makes a cipher of them);
        None when there is no such file; `KeysUnusable` when it cannot be used."""
        path = self.path / f"{key_id}{SUFFIX}"
        try:
            _refuse_open(path, "secrets key", "600")
            return _read_key_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeysUnusable(f"{path}: cannot read the secrets key: {exc.strerror}") from None

    def where(self, key_id: str) -> Path:
        return self.path / f"{key_id}{SUFFIX}"

    def ids(self) -> list[str]:
        """The ids of the key files in the directory."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise KeysUnusable(
                f"{self.path}: cannot list the secrets keys: {exc.strerror}"
            ) from None
        return sorted(name.removesuffix(SUFFIX) for name in names if KEY_FILE.fullmatch(name))

    def make(self) -> tuple[str, bytes]:
        """A new key's file: (its id, the key)."""
        while True:
            key_id = os.urandom(6).hex()
            path = self.where(key_id)
            fresh = self.path / f".{key_id}{SUFFIX}.new"
            try:
                fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    key = AESGCM.generate_key(bit_length=256)
                    os.write(fd, key)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(fresh, path)  # never over another key of that id
                except FileExistsError:
                    continue
                finally:
                    fresh.unlink()
                _sync_dir(self.path)
            except OSError as exc:
                raise KeysUnusable(
                    f"{self.path}: cannot write a secrets key: {exc.strerror}"
                ) from None
            return key_id, key

    def remove(self, key_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.where(key_id).unlink()


def _read_key_file(path: Path) -> bytes:
    """A key file's bytes: a regular file only, opened without blocking, read no further than
    a key could be."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KeysUnusable(f"{path}: not a secrets key: not a regular file")
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _refuse_open(path: Path, what: str, mode: str) -> None:
    """`KeysUnusable` when `path` grants its group or other users anything: a key others
    could read is no longer the control plane's alone."""
    info = path.stat()
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise KeysUnusable(
            f"{path}: the {what} is open to other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}): `chmod {mode}` it, and rotate the keys if "
            "someone else may have read them"
        )


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
