"""The log writer's open segments and their file handles (`deploy.logdir`'s thread only).

An open segment (`OpenSegment`) keeps a file handle while it is among the `limit` written
last (`Handles`): an app per file past that would otherwise hold a descriptor each, for ever.
The one written least recently is let go, synced first (what it holds was acknowledged),
and opened again when next written. A file is opened with O_NOFOLLOW: never through a link
planted in the log directory. `append_whole` writes a batch's bytes whole, or nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from wakeful.domain.logfiles import Segment

log = logging.getLogger(__name__)


@dataclass
class OpenSegment:
    segment: Segment
    path: Path
    file: IO[bytes] | None
    """Its handle, while it is among the `limit` written last; None otherwise."""
    size: int
    last: int


class Handles:
    def __init__(self, limit: int, sync: bool) -> None:
        self._limit = max(1, limit)
        self._sync = sync
        self._open: OrderedDict[int, OpenSegment] = OrderedDict()
        """Segments holding a file handle, the one written least recently first."""

    def of(self, current: OpenSegment) -> IO[bytes]:
        """`current`'s file, opened again if it was let go; past `limit` open at once, the
        one written least recently is let go (synced first: it was acknowledged)."""
        handle = current.file
        if handle is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
            fd = os.open(current.path, flags, 0o600)  # never through a planted link
            handle = current.file = open(fd, "ab", buffering=0)  # noqa: SIM115 (`release`)
        self._open[id(current)] = current
        self._open.move_to_end(id(current))
        while len(self._open) > self._limit:
            _, oldest = self._open.popitem(last=False)
            if oldest.file is not None and self._sync:
                with contextlib.suppress(OSError):
                    os.fdatasync(oldest.file.fileno())
            self.release(oldest)
        return handle

    def release(self, current: OpenSegment) -> None:
        self._open.pop(id(current), None)
        if current.file is not None:
            with contextlib.suppress(OSError):
                current.file.close()
            current.file = None

    def append_whole(self, current: OpenSegment, data: bytes) -> bool:
        """Append `data` whole, or nothing: a write the disk takes only part of (a full disk
        takes what fits) is cut back to where it began, so that the lines counted as lost are
        exactly those not in the file. Unbuffered: nothing is left half-way in a buffer."""
        handle = None
        written = 0
        try:
            handle = self.of(current)
            view = memoryview(data)
            while written < len(data):
                step = os.write(handle.fileno(), view[written:])
                if step <= 0:
                    raise OSError(f"the file took {written} of {len(data)} bytes")
                written += step
        except OSError as exc:
            log.warning("could not write %s: %s; its lines are dropped", current.path, exc)
            if handle is not None and written:
                try:
                    os.ftruncate(handle.fileno(), current.size)
                except OSError:  # cannot cut back: the segment is left, its torn end unread
                    current.size += written
            return False
        current.size += len(data)
        return True
