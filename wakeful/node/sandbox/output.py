"""A sandbox's output on this node: a log file that never grows past `max_log_bytes` (it is
rotated once to `<name>.1`), and its last bytes in memory, so a crash can be reported with its
last lines (`tail_of`).

A log file that cannot be written (a full disk) costs only the file: the caller goes on reading
the sandbox's pipe, so the app never blocks on it, and what the file missed is counted in
`dropped`.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)
MAX_LOG_BYTES = 1024 * 1024
TAIL_LINES = 20
RECENT_BYTES = 16 * 1024


def tail_of(recent: bytes | bytearray) -> str:
    """What a crash is reported with: the last `TAIL_LINES` lines, each cut to its last 1000
    characters."""
    lines = recent.decode(errors="replace").splitlines()
    return "\n".join(line[-1000:] for line in lines[-TAIL_LINES:])


class OutputLog:
    """One sandbox's output: the bounded file at `path` and the last `RECENT_BYTES` in memory."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self._path = path
        self._max = max_bytes
        self._recent = bytearray()
        self._log: BinaryIO | None = None
        self._written = 0
        self.dropped = 0
        """Output bytes the log file could not take (a full disk)."""

    def add(self, chunk: bytes) -> None:
        self._recent += chunk
        del self._recent[: max(0, len(self._recent) - RECENT_BYTES)]
        self._append(chunk)

    def tail(self) -> str:
        return tail_of(self._recent)

    def _append(self, chunk: bytes) -> None:
        try:
            if self._log is None:
                self._log = self._path.open("ab")
                self._written = self._log.tell()
            if self._written + len(chunk) > self._max:
                self.close()
                self._path.replace(self._path.with_name(self._path.name + ".1"))
                self._log = self._path.open("ab")
                self._written = 0
            self._log.write(chunk)
            self._log.flush()
            self._written += len(chunk)
        except OSError as exc:
            if not self.dropped:
                log.warning("cannot write %s, dropping output: %s", self._path, exc)
            self.dropped += len(chunk)
            self.close()

    def close(self) -> None:
        """Close the file (the next `add` opens it again, appending)."""
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
