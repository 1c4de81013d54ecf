"""Told at once when a file is written, by any process: Linux's inotify, for the look of a
store several processes share (`LocalStore._follow_others`).

A SQLite store that other processes write too (`wakeful up`'s ingress workers open its file)
sees their commits by looking at SQLite's `data_version`. The look waits for a nudge from the
kernel (the store file or its WAL written) or for its interval, whichever comes first: another
process's write reaches this one's watchers within a look (a thread hop and a PRAGMA), not
within an interval, and the interval is only a fallback (a file system inotify cannot watch,
an overflowed event queue), long enough that an idle process hardly wakes.

Through ctypes: the standard library has no inotify, and three calls of the C library
(`inotify_init1`, `inotify_add_watch`, `read` on its descriptor) are all it takes. The
directory is watched, not the files: SQLite makes and removes its WAL as connections come
and go, and a watch on a removed file is gone with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

IN_MODIFY: Final = 0x002
IN_MOVED_TO: Final = 0x080
IN_CREATE: Final = 0x100
IN_Q_OVERFLOW: Final = 0x4000
_EVENT: Final = struct.Struct("iIII")
"""`struct inotify_event` without its name: wd, mask, cookie, len (the name's bytes)."""


def events(buffer: bytes) -> Iterator[tuple[int, bytes]]:
    """The (mask, name) of each event a read of an inotify descriptor gave."""
    at = 0
    while at + _EVENT.size <= len(buffer):
        _, mask, _, length = _EVENT.unpack_from(buffer, at)
        at += _EVENT.size
        yield mask, buffer[at : at + length].rstrip(b"\0")
        at += length


class FileNudge:
    """Set when `path` or its SQLite companions (`-wal`) are written, made, or moved in."""

    def __init__(self, path: Path) -> None:
        path = Path(os.path.realpath(path))  # SQLite puts the WAL beside the file a link names
        self._dir = path.parent
        self._names = {os.fsencode(path.name + suffix) for suffix in ("", "-wal")}
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nudged = asyncio.Event()

    def start(self) -> bool:
        """Watch from now on; False when this system cannot (no inotify, no watch left)."""
        # The process's own symbols, which hold the C library's: no `find_library`, which
        # runs ldconfig in a subprocess (~100 ms, here on the event loop).
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except AttributeError:  # not Linux
            return False
        fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return False
        if add(fd, os.fsencode(self._dir), IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0:
            os.close(fd)
            return False
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._read)
        return True

    def _read(self) -> None:
        while True:
            try:
                buffer = os.read(self._fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # closed under us
                return
            if not buffer:
                return
            for mask, name in events(buffer):
                if mask & IN_Q_OVERFLOW or name in self._names:
                    self._nudged.set()

    async def wait(self, longest: float) -> bool:
        """Until the file was written since the last wait (True), or `longest` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(longest):
                await self._nudged.wait()
        nudged = self._nudged.is_set()
        self._nudged.clear()
        return nudged

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
