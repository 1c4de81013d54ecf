"""The log directory's writer: lines to segment files, on a thread of its own (issue 40).

Theory of operation:
- The event loop only queues (`append`, which never blocks and never raises): one thread
  writes everything queued, in order, then `fdatasync`s each file it touched once (a group
  commit), then resolves each append's future. A caller that awaits `written` knows its lines
  are on disk: the control plane answers a node's batch only then.
- What waits in the queue is bounded (`max_pending` bytes): past it an append is dropped at
  once and counted (`reason="backlog"`), so a slow or hung disk never holds a node, an
  ingress or the loop. A write that fails (a full disk) is cut back to the last whole line,
  its lines are dropped and counted (`reason="disk"`), and the next write that succeeds for
  that app and kind first records how many were lost there. Nothing here ends a process.
- Each app and kind has at most one open segment of this writer's; it is closed once it
  passes `segment_bytes` or `segment_age`, compressed to its closed name, and the open file
  removed. Open segments of other writers (a previous `wakeful up`, a deposed leader), and
  this writer's own that a write failed on, are closed the same way once nobody has written
  them for `stale_after` seconds; their torn last line, if any, is left out.
- Retention (`wakeful.domain.logfiles.expired`) runs after every close and every
  `sweep_every` seconds, over an index of every segment built at start and kept by this thread
  alone. Apps' directories left empty are removed.

Layout and rules: `wakeful.domain.logfiles`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from wakeful.deploy.loghandles import Handles, OpenSegment
from wakeful.deploy.logsegment import LogMetrics, compress, last_time, listing
from wakeful.domain.logfiles import (
    KINDS,
    Kind,
    Limits,
    Segment,
    expired,
    iso,
    to_ms,
)

log = logging.getLogger(__name__)

SEGMENT_BYTES = 4 * 1024 * 1024
SEGMENT_AGE = 3600.0
MAX_PENDING = 64 * 1024 * 1024
STALE_AFTER = 60.0
MAX_HANDLES = 256
"""Open segments' files held open at once: ten thousand apps must not need as many handles."""
FAILING_PAUSE = 1.0
"""Seconds after a failed write before an app's lines of that kind open a new segment."""
KEEP_CLOSED = 60.0
"""Seconds a closed segment's uncompressed file stays beside its compressed copy."""
SWEEP_EVERY = 60.0
_STOP = object()


def encode(record: dict[str, object]) -> bytes:
    """One line of a segment: compact JSON, UTF-8 as it is, ending in a newline."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@dataclass
class _Append:
    app: str
    kind: Kind
    lines: list[bytes]
    first: int
    """Milliseconds: the earliest line's time."""
    last: int
    size: int
    done: Future[int] = field(default_factory=Future)


@dataclass
class _Upkeep:
    done: Future[None] = field(default_factory=Future)


class LogDir:
    """The writer of one control plane (its name: `writer`, see `wakeful.domain.logfiles`)."""

    def __init__(
        self,
        root: Path,
        writer: str,
        limits: Limits,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        segment_age: float = SEGMENT_AGE,
        max_pending: int = MAX_PENDING,
        stale_after: float = STALE_AFTER,
        sweep_every: float = SWEEP_EVERY,
        keep_closed: float = KEEP_CLOSED,
        max_handles: int = MAX_HANDLES,
        sync: bool = True,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.root = root
        self.writer = writer
        self.limits = limits
        self._segment_bytes = max(1024, min(segment_bytes, limits.app_max_bytes // 4))
        self._segment_age = segment_age
        self._max_pending = max_pending
        self._stale_after = stale_after
        self._keep_closed = keep_closed
        self._handles = Handles(max_handles, sync)
        self._sweep_every = sweep_every
        self._sync = sync
        self._clock = clock
        self.metrics = LogMetrics(registry)
        self._queue: queue.SimpleQueue[_Append | _Upkeep | object] = queue.SimpleQueue()
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._backlog_lost: dict[tuple[str, Kind], int] = {}
        """Lines dropped at `append` (the backlog full), under `_pending_lock`."""
        self._thread: threading.Thread | None = None
        # The writer thread's own, from here on:
        self._open: dict[tuple[str, Kind], OpenSegment] = {}
        self._segments: dict[tuple[str, Kind], list[Segment]] = {}
        """Every segment but this writer's open ones, per app and kind."""
        self._lost: dict[tuple[str, Kind], int] = {}
        self._failing: dict[tuple[str, Kind], float] = {}
        """Per app and kind, until when (the clock) no new segment is opened after a failure:
        a full disk does not get a new empty file, and a warning, for every write."""
        self._retiring: list[tuple[Path, float]] = []
        """Open files already compressed, and since when: removed after `keep_closed`."""
        self._swept = 0.0

    # -- the loop's side ------------------------------------------------------------------

    def start(self) -> None:
        """OSError naming the directory (and WAKEFUL_LOG_DIR) when it cannot be made."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.root.is_dir():
                raise NotADirectoryError(20, "not a directory")
        except OSError as exc:
            raise OSError(
                exc.errno, f"the log directory (WAKEFUL_LOG_DIR) {self.root}: {exc.strerror}"
            ) from None
        self._scan()
        self._thread = threading.Thread(target=self._run, name="wakeful-logdir", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued, then stop the thread (open segments stay open: the next
        writer closes them). A thread still writing after 30 s (a stalled disk) keeps its
        files, and is looked for again by the next call."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=30)
            if self._thread.is_alive():  # its files are its own while it may still write to
                # them: a number closed under it could be another file's by its next write
                log.warning("the log writer did not stop within 30 s; its files are left open")
                return
            self._thread = None
        for current in self._open.values():
            self._handles.release(current)
        self._open.clear()

    def append(
        self, app: str, kind: Kind, lines: list[bytes], first: float, last: float
    ) -> Future[int]:
        """Queue `lines` (each from `encode`) of `app`'s `kind`, their times from `first` to
        `last` (seconds). The future gives the lines dropped (0 once all are on disk)."""
        size = sum(len(line) for line in lines)
        with self._pending_lock:
            if self._pending + size > self._max_pending:
                self.metrics.dropped.labels(reason="backlog").inc(len(lines))
                key = (app, kind)  # said in the log with the next lines written for them
                self._backlog_lost[key] = self._backlog_lost.get(key, 0) + len(lines)
                dropped: Future[int] = Future()
                dropped.set_result(len(lines))
                return dropped
            self._pending += size
        item = _Append(app, kind, lines, to_ms(first), to_ms(last), size)
        self._queue.put(item)
        return item.done

    def upkeep(self) -> Future[None]:
        """Run the upkeep (closing segments past their age, retention) now, after what is
        queued; the writer also runs it every second, each part on its own schedule."""
        item = _Upkeep()
        self._queue.put(item)
        return item.done

    # -- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=1.0)
            except queue.Empty:
                first = None
            batch: list[_Append] = []
            asked: list[_Upkeep] = []
            stopping = first is _STOP
            item = first
            while True:
                if isinstance(item, _Append):
                    batch.append(item)
                elif isinstance(item, _Upkeep):
                    asked.append(item)
                if stopping:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                stopping = item is _STOP
            try:
                self._write(batch)
            except Exception:  # never the thread's end: what it holds is counted as dropped
                log.exception("the log writer failed; its lines are dropped")
                for item in batch:
                    if not item.done.done():
                        self._dropped(item, "disk")
            try:
                self._housekeep(force=bool(asked))
            except Exception:
                log.exception("the log directory's upkeep failed; it runs again later")
            for upkeep in asked:
                upkeep.done.set_result(None)
            if stopping:
                return

    def _write(self, batch: list[_Append]) -> None:
        touched: dict[int, OpenSegment] = {}
        results: list[tuple[_Append, int]] = []
        with self._pending_lock:
            backlog, self._backlog_lost = self._backlog_lost, {}
        for key, count in backlog.items():
            self._lost[key] = self._lost.get(key, 0) + count
        for item in batch:
            current = self._segment_for(item)
            dropped = len(item.lines)
            if current is not None:
                lost = self._lost.pop((item.app, item.kind), 0)
                data = b"".join(item.lines)
                if lost:
                    data = self._lost_line(item, lost) + data
                if self._handles.append_whole(current, data):
                    current.last = max(current.last, item.last)
                    touched[id(current)] = current
                    dropped = 0
                    self.metrics.written.labels(kind=item.kind).inc(len(item.lines))
                else:  # a write after `FAILING_PAUSE` opens a segment anew (once freed)
                    self._abandon(current)
                    self._failing[(item.app, item.kind)] = self._clock() + FAILING_PAUSE
                    touched.pop(id(current), None)
                    if lost:
                        self._lost[(item.app, item.kind)] = lost
            if dropped:
                self._lost[(item.app, item.kind)] = (
                    self._lost.get((item.app, item.kind), 0) + dropped
                )
            results.append((item, dropped))
        unsynced = self._sync_all(touched) if self._sync else set()
        for index, (item, dropped) in enumerate(results):
            if not dropped and (item.app, item.kind) in unsynced:  # written, then not kept
                dropped = len(item.lines)
                key = (item.app, item.kind)
                self._lost[key] = self._lost.get(key, 0) + dropped
                results[index] = (item, dropped)
            with self._pending_lock:
                self._pending -= item.size
            if dropped:
                self.metrics.dropped.labels(reason="disk").inc(dropped)
            _settle(item.done, dropped)
        for current in list(touched.values()):
            if current.size >= self._segment_bytes:
                self._close(current)

    def _sync_all(self, touched: dict[int, OpenSegment]) -> set[tuple[str, Kind]]:
        """`fdatasync` each file written this round; the app and kind of those whose sync
        failed (on a network mount an error often shows only here): their lines this round
        are not kept, and the segment is left."""
        failed = set()
        for key, current in list(touched.items()):
            if current.file is None:
                continue
            try:
                os.fdatasync(current.file.fileno())
            except OSError as exc:
                log.warning("could not sync %s: %s; its lines are dropped", current.path, exc)
                failed.add((current.segment.app, current.segment.kind))
                self._abandon(current)
                del touched[key]
        return failed

    def _abandon(self, current: OpenSegment) -> None:
        """A segment a write failed on: closed as it is, left for the upkeep to compress once
        stale, as a dead writer's."""
        self._open.pop((current.segment.app, current.segment.kind), None)
        self._handles.release(current)
        segment = current.segment
        left = Segment(segment.app, segment.kind, segment.start, None, self.writer, current.size)
        self._segments.setdefault((segment.app, segment.kind), []).append(left)

    def _dropped(self, item: _Append, reason: str) -> None:
        with self._pending_lock:
            self._pending -= item.size
        self.metrics.dropped.labels(reason=reason).inc(len(item.lines))
        _settle(item.done, len(item.lines))

    def _lost_line(self, item: _Append, lost: int) -> bytes:
        at = item.first / 1000
        return encode(
            {
                "ts": at,
                "time": iso(at),
                "app": item.app,
                "wakeful": f"{lost} lines lost here: the log directory could not take them",
            }
        )

    def _segment_for(self, item: _Append) -> OpenSegment | None:
        key = (item.app, item.kind)
        current = self._open.get(key)
        if current is not None:
            return current
        if self._failing.get(key, 0.0) > self._clock():
            return None  # a write failed a moment ago: no new file a write for a while
        folder = self._folder(item.app, item.kind)
        start = max(0, item.first)
        while (folder / Segment(item.app, item.kind, start, None, self.writer).name).exists():
            start += 1  # a name still in use (a closed segment's file kept for shippers)
        segment = Segment(item.app, item.kind, start, None, self.writer)
        path = folder / segment.name
        current = OpenSegment(segment, path, None, 0, item.last)
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            current.size = self._handles.of(current).tell()
        except OSError as exc:
            log.warning("could not open %s: %s; its lines are dropped", path, exc)
            self._handles.release(current)
            self._failing[key] = self._clock() + FAILING_PAUSE
            return None
        self._open[key] = current
        return current

    def _folder(self, app: str, kind: Kind) -> Path:
        return self.root / "apps" / app / kind

    # -- closing, and retention -----------------------------------------------------------

    def _close(self, current: OpenSegment) -> None:
        key = (current.segment.app, current.segment.kind)
        self._open.pop(key, None)
        self._handles.release(current)
        closed = self._compress(current.path, current.segment, current.last)
        if closed is not None:
            self._segments.setdefault(key, []).append(closed)
        self._retain()

    def _compress(self, path: Path, segment: Segment, last: int) -> Segment | None:
        """`compress`, the open file removed `keep_closed` seconds later (a shipper tailing
        it reads to its end meanwhile; readers here read the compressed copy at once)."""
        closed = compress(path, segment, last)
        if closed is not None and path.exists():
            self._retiring.append((path, self._clock()))
        return closed

    def _housekeep(self, force: bool = False) -> None:
        now = self._clock()
        for current in list(self._open.values()):
            if to_ms(now) - current.segment.start >= self._segment_age * 1000:
                self._close(current)
        while self._retiring and now - self._retiring[0][1] >= self._keep_closed:
            with contextlib.suppress(OSError):
                self._retiring.pop(0)[0].unlink()
        if now - self._swept < self._sweep_every and not force:
            return
        self._swept = now
        self._scan()
        for key, found in list(self._segments.items()):
            for segment in [s for s in found if s.end is None]:  # not this writer's open ones
                path = self._folder(*key) / segment.name
                try:
                    modified = path.stat().st_mtime
                except OSError:
                    found.remove(segment)
                    continue
                if now - modified >= self._stale_after:
                    found.remove(segment)
                    closed = self._compress(path, segment, last_time(path, segment.start))
                    if closed is not None:
                        found.append(closed)
        self._retain()

    def _retain(self) -> None:
        every = [s for found in self._segments.values() for s in found]
        every += [
            Segment(o.segment.app, o.segment.kind, o.segment.start, None, self.writer, o.size)
            for o in self._open.values()
        ]
        gone = expired(every, to_ms(self._clock()), self.limits)
        for segment in gone:
            folder = self._folder(segment.app, segment.kind)
            opened = Segment(segment.app, segment.kind, segment.start, None, segment.writer)
            self._retiring = [(p, at) for p, at in self._retiring if p.name != opened.name]
            for name in (segment.name, opened.name):
                with contextlib.suppress(OSError):
                    (folder / name).unlink()
            found = self._segments.get((segment.app, segment.kind), [])
            with contextlib.suppress(ValueError):
                found.remove(segment)
            if not found and (segment.app, segment.kind) not in self._open:
                self._segments.pop((segment.app, segment.kind), None)
                self._prune(segment.app)
        self.metrics.stored.set(sum(s.size for s in every) - sum(s.size for s in gone))

    def _prune(self, app: str) -> None:
        """An app's folders once nothing is left in them (a deleted app's, say)."""
        folder = self.root / "apps" / app
        for kind in KINDS:
            with contextlib.suppress(OSError):
                (folder / kind).rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()

    def _scan(self) -> None:
        """The index again from the directory (`logsegment.listing`): every segment but this
        writer's open ones; open files already compressed are retiring. At the start and at
        every sweep."""
        mine = {current.path for current in self._open.values()}
        self._segments, compressed = listing(self.root, mine)
        retiring = {path for path, _ in self._retiring}
        self._retiring += [(path, self._clock()) for path in compressed if path not in retiring]


def _settle(future: Future[int], dropped: int) -> None:
    """A write's outcome, unless its waiter gave up on it (a cancelled future)."""
    if not future.done():
        future.set_result(dropped)
