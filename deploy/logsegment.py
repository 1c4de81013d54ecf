"""A log segment's file operations (issue 40): closing one (compressed to its closed name, up to
its last whole line), and reading the time of its last line; and the writer's metrics. The
writer (`wakeful.deploy.logdir`) calls these on its own thread.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry, Counter, Gauge

from wakeful.domain.logfiles import KINDS, Kind, Segment, parse_segment, reading_order, to_ms
from wakeful.domain.models import NAME_PATTERN

log = logging.getLogger(__name__)


class LogMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.written = Counter(
            "wakeful_logs_lines_written_total",
            "Lines written to the log directory, by kind (output, access)",
            ["kind"],
            registry=registry,
        )
        self.dropped = Counter(
            "wakeful_logs_lines_dropped_total",
            "Lines the control plane could not keep: backlog (the writer was behind), disk "
            "(a write or its sync failed: a full disk); each said in the log once it can",
            ["reason"],
            registry=registry,
        )
        self.stored = Gauge(
            "wakeful_logs_bytes", "Bytes of segments in the log directory", registry=registry
        )
        for reason in ("backlog", "disk"):
            self.dropped.labels(reason=reason)
        for kind in KINDS:
            self.written.labels(kind=kind)


def compress(path: Path, segment: Segment, last: int) -> Segment | None:
    """`path` (an open segment) compressed to its closed name beside it, up to its last whole
    line (a torn one, from a crash mid-write, is left out), through a temporary file and a
    rename; the open file stays (the caller removes it). An open file with no whole line is
    removed. None when nothing was made."""
    closed = Segment(
        segment.app, segment.kind, segment.start, max(last, segment.start), segment.writer
    )
    target = path.with_name(closed.name)
    temporary = path.with_name(f".{closed.name}.tmp")
    try:
        source_fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # a planted link is not copied
        with open(source_fd, "rb") as source, gzip.open(temporary, "wb", compresslevel=5) as out:
            whole = _whole_length(source)
            source.seek(0)
            _copy(source, out, whole)
        if whole == 0:
            temporary.unlink()
            path.unlink()
            return None
        os.replace(temporary, target)
        size = target.stat().st_size
    except OSError as exc:
        log.warning("could not close the log segment %s: %s", path, exc)
        with contextlib.suppress(OSError):
            temporary.unlink()
        return None
    return Segment(closed.app, closed.kind, closed.start, closed.end, closed.writer, size)


def _whole_length(source: IO[bytes]) -> int:
    """Bytes up to and including the last newline."""
    end = source.seek(0, os.SEEK_END)
    position = end
    while position > 0:
        step = min(65536, position)
        source.seek(position - step)
        block = source.read(step)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return position - step + newline + 1
        position -= step
    return 0


def _copy(source: IO[bytes], out: gzip.GzipFile, length: int) -> None:
    left = length
    while left > 0:
        block = source.read(min(1 << 20, left))
        if not block:
            break
        out.write(block)
        left -= len(block)


def last_time(path: Path, default: int) -> int:
    """The time of the last whole line of an open segment (ms), or `default`."""
    try:
        with open(path, "rb") as source:
            whole = _whole_length(source)
            source.seek(max(0, whole - 65536))
            tail = source.read(whole - source.tell())
    except OSError:
        return default
    for line in reversed(tail.splitlines()):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            return max(default, to_ms(float(json.loads(line)["ts"])))
    return default


def listing(
    root: Path, mine: set[Path]
) -> tuple[dict[tuple[str, Kind], list[Segment]], list[Path]]:
    """Every segment under `root` by app and kind, in reading order, but those at `mine` (a
    writer's own open ones); and the open files that already have a compressed copy (to
    remove once shippers had their minute). Leftovers of a compression cut short go."""
    index: dict[tuple[str, Kind], list[Segment]] = {}
    compressed: list[Path] = []
    apps = root / "apps"
    if not apps.is_dir():
        return index, compressed
    for folder in apps.iterdir():
        if re.fullmatch(NAME_PATTERN, folder.name) is None:
            continue
        for kind in KINDS:
            found: list[Segment] = []
            with contextlib.suppress(OSError), os.scandir(folder / kind) as entries:
                for entry in entries:
                    if entry.name.endswith(".tmp"):
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
                        continue
                    segment = parse_segment(folder.name, kind, entry.name, entry.stat().st_size)
                    if segment is not None:
                        found.append(segment)
            kept = reading_order(found)
            compressed += [folder / kind / s.name for s in found if s not in kept]
            kept = [s for s in kept if folder / kind / s.name not in mine]
            if kept:
                index[(folder.name, kind)] = kept
    return index, compressed
