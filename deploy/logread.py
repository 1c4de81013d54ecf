"""Reading the log directory: an app's lines of one kind, filtered, streamed (issue 40).

Theory of operation:
- Only the segments whose span meets the asked range are opened (`Segment.meets`; a segment
  may hold lines up to `SKEW` older than its start: an ingress's access lines carry its own
  clock and arrive up to a report later, so `until` is widened by it).
- A file is read in blocks of `BLOCK` bytes, whole lines only (a line still being written, with
  no newline yet, is not read). With `--grep`, `--sandbox` or `--version`, each block is
  searched for the filter's bytes as the writer encodes them, and only the lines holding them
  are parsed: a rare match in a million lines costs a scan at C speed, not a million parses.
- `forward` yields matches oldest first without holding more than a block; `tail` reads
  segments newest first and keeps at most the `n` lines asked for. Memory is bounded either
  way, whatever an app's history holds.
- Segments are listed once, when a read begins. One listed open and closed since (its open
  file removed a minute after the close) is read from its compressed copy: a long read misses
  nothing that was there when it began.

These run on a worker thread (they block on the disk), never on the event loop.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedIOBase
from pathlib import Path
from typing import Any

from wakeful.domain.logfiles import Kind, Segment, parse_segment, reading_order, to_ms

BLOCK = 1 << 20
MAX_LINE_BYTES = 4 << 20
"""Longer than any line the writer makes (a 16 KiB line, escaped, is at most ~100 KiB)."""
SKEW = 60.0
"""Seconds a line's time may precede its segment's start (see the module's notes)."""
LOOKUP_SEGMENTS = 3
"""Newest segments searched for sandboxes' last offsets after a restart (`last_offsets`)."""


@dataclass(frozen=True, slots=True)
class Query:
    since: float | None = None
    until: float | None = None
    grep: str | None = None
    """Text the line holds (an output line's text; an access line's method, path, status)."""
    sandbox: str | None = None
    version: str | None = None


def folder(root: Path, app: str, kind: Kind) -> Path:
    return root / "apps" / app / kind


def segments(root: Path, app: str, kind: Kind) -> list[Segment]:
    """The app's segments of `kind`, in reading order; none for an app with no logs."""
    found = []
    with contextlib.suppress(OSError), os.scandir(folder(root, app, kind)) as entries:
        for entry in entries:
            segment = parse_segment(app, kind, entry.name)
            if segment is not None:
                found.append(segment)
    return reading_order(found)


def has_logs(root: Path, app: str) -> bool:
    return any(segments(root, app, kind) for kind in ("output", "access"))


class _Filter:
    def __init__(self, query: Query, kind: Kind) -> None:
        self.query = query
        self.kind = kind
        needles = []
        if query.grep:
            # An access line's text is made of several fields: each word is in one of them.
            words = query.grep.split() if kind == "access" else [query.grep]
            needles += [json.dumps(w, ensure_ascii=False)[1:-1].encode() for w in words if w]
        if query.sandbox:
            needles.append(b'"sandbox":' + json.dumps(query.sandbox).encode())
        if query.version:
            needles.append(b'"version":' + json.dumps(query.version).encode())
        self.needles = needles
        self.since = query.since
        self.until = query.until

    def check(self, raw: bytes, timed: bool) -> bool:
        """Whether `raw` (a whole line, newline excluded) matches; `timed`: its time must be
        checked (the segment is not wholly inside the range)."""
        if not (self.needles or timed):
            return True
        try:
            record = json.loads(raw)
        except ValueError:
            return False
        if not isinstance(record, dict):
            return False
        if timed:
            ts = record.get("ts")
            if not isinstance(ts, int | float):
                return False
            if self.since is not None and ts < self.since:
                return False
            if self.until is not None and ts > self.until:
                return False
        query = self.query
        if query.sandbox and record.get("sandbox") != query.sandbox:
            return False
        if query.version and record.get("version") != query.version:
            return False
        return not query.grep or query.grep in searched_text(record, self.kind)


def searched_text(record: dict[str, Any], kind: Kind) -> str:
    if "wakeful" in record:
        return str(record["wakeful"])
    if kind == "output":
        return str(record.get("line", ""))
    return f"{record.get('method', '')} {record.get('path', '')} {record.get('status', '')}"


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[BufferedIOBase]:
    """A segment, never through a symbolic link (nothing here makes one: one planted in the
    directory is refused, not followed)."""
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as raw:
        if path.name.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as unpacked:
                yield unpacked
        else:
            yield raw


def _blocks(source: BufferedIOBase) -> Iterator[bytes]:
    """Whole lines, a block at a time (each ends in a newline); a torn last line is left, and
    so is a "line" longer than `MAX_LINE_BYTES` (no writer makes one: a corrupt file)."""
    rest = b""
    skipping = False
    while True:
        block = source.read(BLOCK)
        if not block:
            return
        end = block.rfind(b"\n")
        if end < 0:
            rest += block
            if len(rest) > MAX_LINE_BYTES:
                rest, skipping = b"", True
            continue
        block = rest + block
        end += len(rest)
        if skipping:  # the end of an overlong line: what follows its newline is whole
            block = block[block.index(b"\n") + 1 :]
            end = block.rfind(b"\n")
            skipping = False
        rest = block[end + 1 :]
        if end >= 0:
            yield block[: end + 1]


def _matches(block: bytes, check: _Filter, timed: bool) -> Iterator[bytes]:
    needles = check.needles
    if not needles:
        for line in block.split(b"\n")[:-1]:
            # Unparsed on this path: a line that is no record (a corrupt file) is left out.
            if line.startswith(b"{") and line.endswith(b"}") and check.check(line, timed):
                yield line + b"\n"
        return
    first = max(needles, key=len)
    position = 0
    while True:
        at = block.find(first, position)
        if at < 0:
            return
        start = block.rfind(b"\n", 0, at) + 1
        end = block.index(b"\n", at)
        line = block[start:end]
        position = end + 1
        if all(needle in line for needle in needles) and check.check(line, timed):
            yield line + b"\n"


def _segment_lines(root: Path, segment: Segment, check: _Filter) -> Iterator[bytes]:
    since, until = check.since, check.until
    timed = not (
        (since is None or segment.start >= to_ms(since + SKEW))
        and (until is None or (segment.end is not None and segment.end <= to_ms(until)))
    )
    where = folder(root, segment.app, segment.kind)
    try:
        yield from _file_lines(where / segment.name, check, timed)
    except FileNotFoundError:
        # Listed open, closed since: its compressed copy holds every line it did.
        copy = None if segment.end is not None else _closed_copy(where, segment)
        if copy is not None:  # else deleted by retention meanwhile
            with contextlib.suppress(FileNotFoundError):
                yield from _file_lines(where / copy, check, timed)


def _file_lines(path: Path, check: _Filter, timed: bool) -> Iterator[bytes]:
    """FileNotFoundError when `path` is gone; any other failure ends the lines quietly (a
    link, a file cut short: what was read stands)."""
    try:
        with _opened(path) as source:
            for block in _blocks(source):
                yield from _matches(block, check, timed)
    except FileNotFoundError:
        raise
    except (OSError, EOFError, gzip.BadGzipFile):
        return


def _closed_copy(where: Path, opened: Segment) -> str | None:
    """The name of the compressed copy of `opened` in `where`, if there is one."""
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            found = parse_segment(opened.app, opened.kind, entry.name)
            if (
                found is not None
                and found.end is not None
                and (found.start, found.writer) == (opened.start, opened.writer)
            ):
                return entry.name
    return None


def forward(root: Path, app: str, kind: Kind, query: Query) -> Iterator[bytes]:
    """Every line matching `query`, oldest first, each ending in a newline."""
    check = _Filter(query, kind)
    since = None if query.since is None else to_ms(query.since)
    until = None if query.until is None else to_ms(query.until + SKEW)
    for segment in segments(root, app, kind):
        if segment.meets(since, until):
            yield from _segment_lines(root, segment, check)


def tail(root: Path, app: str, kind: Kind, query: Query, n: int) -> list[bytes]:
    """The last `n` lines matching `query`, oldest first."""
    check = _Filter(query, kind)
    since = None if query.since is None else to_ms(query.since)
    until = None if query.until is None else to_ms(query.until + SKEW)
    found: deque[bytes] = deque()
    for segment in reversed(segments(root, app, kind)):
        if len(found) >= n:
            break
        if not segment.meets(since, until):
            continue
        newest: deque[bytes] = deque(maxlen=n - len(found))
        newest.extend(_segment_lines(root, segment, check))
        found.extendleft(reversed(newest))
    return list(found)[-n:] if n > 0 else []


def last_offsets(root: Path, app: str, sandboxes: set[str]) -> dict[str, int]:
    """How much of each of `sandboxes`' output the log holds (the `o` of its last line that
    has one), searched in the app's newest output segments only, all in one pass; a sandbox
    not found there is left out."""
    found: dict[str, int] = {}
    check = _Filter(Query(), "output")
    check.needles = [b',"o":']
    for segment in list(reversed(segments(root, app, "output")))[:LOOKUP_SEGMENTS]:
        latest: dict[str, int] = {}
        for line in _segment_lines(root, segment, check):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                record = json.loads(line)
                sandbox, offset = record.get("sandbox"), record.get("o")
                if sandbox in sandboxes and sandbox not in found and isinstance(offset, int):
                    latest[sandbox] = offset
        found |= latest
        if len(found) == len(sandboxes):
            break
    return found
