"""The control plane's intake of its sandboxes' output: pushed by nodes, written to the log
directory before it is acknowledged (issue 40).

Theory of operation:
- Nodes push `LogBatch`es (`wakeful.logbatch`): in `wakeful up` the in-process node agent
  hands them to `LogBook.ship` directly, elsewhere they arrive through `POST /v1/logs`. The
  book never calls a node.
- Each chunk names the bytes of the output stream it holds, so a chunk sent twice (a retry
  after a lost answer) is recorded once, and bytes that never arrived leave a marker line
  and are counted as missing. The book remembers how far each sandbox's stream got (at most
  `max_sandboxes`: past that the one that finished first goes, or, when none has finished,
  the one written least recently); a sandbox it does not know (after a restart, a takeover,
  or an eviction) is looked up in the log itself: the last line of each chunk carries the
  offset the stream reached (`o`).
- A chunk becomes lines (longer ones wrapped at `max_line`); a piece that does not end a line
  yet is written too, marked `"more": true` (the line goes on in the sandbox's next line),
  so that every byte acknowledged to a node is in the log: `ship` returns only once the log
  directory wrote its lines (`wakeful.deploy.logdir`), or raises `ShipFailed` and the node
  sends them again.
- Per node it records when the last batch arrived and what the node said was still pending
  and dropped; `behind` turns that into notes for a reader ("node-a: last batch 14 s ago").

`record` and `behind` take `now`: no clock is read inside, so tests drive time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

import anyio

from wakeful.deploy import logread
from wakeful.deploy.logdir import LogDir, encode
from wakeful.domain.logbatch import LogBatch, OutputChunk, ShipFailed
from wakeful.domain.logfiles import iso

MAX_LINE = 16 * 1024
MAX_SANDBOXES = 4096
MAX_NODES = 1024
STALE_INTERVALS = 5
"""A node whose last batch is this many of its ship intervals old is behind."""
DEFAULT_INTERVAL = 1.0
"""The ship interval assumed of a node not heard from yet (`NodeSettings.log_ship_interval`)."""
_DUMPS = json.JSONEncoder(ensure_ascii=False).encode
"""A line's text as JSON, as `encode` writes it."""
ACCESS_SKEW = 300.0
"""Seconds an access line's time may be from the control plane's clock before it gets it."""
WRITE_TIMEOUT = 10.0
"""Seconds a batch waits for the disk before the node is told to send it again."""


@dataclass
class NodeShipping:
    last_batch_at: float
    interval: float
    pending: int
    dropped: int


@dataclass(eq=False)
class _Stream:
    sandbox_id: str
    app: str
    node: str
    seq: int
    last_write: float
    received: int = 0
    """Bytes of the sandbox's output stream accounted for (received or known missing)."""
    missing: int = 0
    finished_at: float | None = None
    written: Future[int] | None = None
    """The write of its latest lines: done once they are on disk."""


class LogBook:
    def __init__(
        self,
        logdir: LogDir,
        *,
        max_line: int = MAX_LINE,
        max_sandboxes: int = MAX_SANDBOXES,
        max_nodes: int = MAX_NODES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name, value in [
            ("max_line", max_line),
            ("max_sandboxes", max_sandboxes),
            ("max_nodes", max_nodes),
        ]:
            if value < 1:
                raise ValueError(f"{name}: must be at least 1 (got {value})")
        self.logdir = logdir
        self._max_line = max_line
        self._max_sandboxes = max_sandboxes
        self._max_nodes = max_nodes
        self._clock = clock
        self._since = clock()
        self._streams: dict[str, _Stream] = {}
        self._nodes: dict[str, NodeShipping] = {}
        """In order of their last batch, oldest first."""
        self._last: dict[str, int] = {}
        """Per app, the time given to its last line: each line's is later (a reader's cursor)."""
        self._seq = itertools.count()

    # -- the LogSink a node agent ships to ----------------------------------------------------

    async def ship(self, batch: LogBatch) -> None:
        """Record `batch` and return once its lines are on disk (`ShipFailed` when the disk
        did not answer within `WRITE_TIMEOUT`: the node keeps them and sends them again)."""
        seen = set()
        unknown: dict[str, list[OutputChunk]] = {}
        for chunk in batch.chunks:  # a sandbox's first chunk here tells where it stands
            if chunk.sandbox in seen:
                continue
            seen.add(chunk.sandbox)
            if chunk.offset > 0 and chunk.sandbox not in self._streams:
                unknown.setdefault(chunk.app, []).append(chunk)
        for app, chunks in unknown.items():  # one pass over the app's newest segments
            names = {chunk.sandbox for chunk in chunks}
            reached = await anyio.to_thread.run_sync(
                logread.last_offsets, self.logdir.root, app, names
            )
            for chunk in chunks:
                self._adopt(batch.node, chunk, reached.get(chunk.sandbox))
        pending = self.record(batch, self._clock())
        if not pending:
            return
        # Never cancelled here: a write that is late still lands, and the batch sent again
        # waits for it (`record`), so that no answer says "taken" before the disk has it.
        _, late = await asyncio.wait(
            [asyncio.wrap_future(f) for f in pending], timeout=WRITE_TIMEOUT
        )
        if late:
            raise ShipFailed(f"the log directory did not write within {WRITE_TIMEOUT:g} s")

    def now(self) -> float:
        return self._clock()

    # -- writing ------------------------------------------------------------------------------

    def record(self, batch: LogBatch, now: float) -> list[Future[int]]:
        """Take `batch`; the writes `ship` waits for: those of its lines, per app, and any
        earlier write of its sandboxes' streams that has not landed yet (a batch sent again
        after a slow disk's 503 is taken as it was, and answered once that is on disk)."""
        self._nodes.pop(batch.node, None)
        self._nodes[batch.node] = NodeShipping(now, batch.interval, batch.pending, batch.dropped)
        while len(self._nodes) > self._max_nodes:
            del self._nodes[next(iter(self._nodes))]
        lines: dict[str, list[bytes]] = {}
        wrote: dict[str, list[_Stream]] = {}
        for chunk in batch.chunks:
            out = lines.setdefault(chunk.app, [])
            before = len(out)
            stream = self._take(batch.node, chunk, now, out)
            if len(out) > before:
                wrote.setdefault(chunk.app, []).append(stream)
        pending: list[Future[int]] = []
        for app, written in lines.items():
            if written:
                at = self._last[app] / 1e6
                future = self.logdir.append(app, "output", written, at, at)
                for stream in wrote[app]:
                    stream.written = future
                pending.append(future)
        for chunk in batch.chunks:
            earlier = self._streams[chunk.sandbox].written
            if earlier is not None and not earlier.done() and earlier not in pending:
                pending.append(earlier)
        return pending

    def _adopt(self, node: str, chunk: OutputChunk, reached: int | None) -> None:
        """A sandbox this book did not know, its stream taken as far as the log holds it; when
        the log's newest segments hold none of it, what came before this chunk is a gap (it
        may be in older segments: a marker too many beats a loss unsaid)."""
        self._make_room()
        stream = self._streams[chunk.sandbox] = _Stream(
            chunk.sandbox, chunk.app, node, next(self._seq), self._clock()
        )
        stream.received = reached or 0

    def _take(self, node: str, chunk: OutputChunk, now: float, out: list[bytes]) -> _Stream:
        """`chunk`'s new lines, encoded, onto `out`. Each line's `ts` is later than the app's
        line before (`_next_time`), its `time` the batch's; a line is assembled from the
        chunk's fields encoded once, not encoded whole: this runs on the event loop, for
        every line a node sends."""
        stream = self._streams.get(chunk.sandbox)
        if stream is None:
            self._make_room()
            stream = self._streams[chunk.sandbox] = _Stream(
                chunk.sandbox, chunk.app, node, next(self._seq), now
            )
        stream.node = node
        stream.last_write = now
        end = chunk.offset + chunk.size
        text = chunk.text
        pieces: list[tuple[str, bool]] = []
        """(text, more): the lines to write."""
        if end <= stream.received:
            text = ""  # sent before: a retry after a lost answer
        elif chunk.offset < stream.received:
            overlap = stream.received - chunk.offset  # partly sent before
            text = text.encode()[overlap:].decode(errors="replace")
        elif chunk.offset > stream.received:
            gap = chunk.offset - stream.received
            stream.missing += gap
            pieces.append((f"[wakeful: {gap} bytes of output missing here]", False))
        stream.received = max(stream.received, end)
        if text:
            *whole, rest = text.split("\n")
            cut = self._max_line
            for line in whole:
                if len(line) <= cut:
                    pieces.append((line.removesuffix("\r"), False))
                else:
                    pieces.extend(self._wrapped(line.removesuffix("\r"), False))
            if rest:
                pieces.extend(self._wrapped(rest, True))
        if chunk.finished and stream.finished_at is None:
            stream.finished_at = now
        if not pieces:
            return stream
        when = f',"time":"{iso(now)}",'
        fields = json.dumps(
            {"app": chunk.app, "version": chunk.version, "sandbox": chunk.sandbox, "node": node},
            separators=(",", ":"),
        )[1:-1]
        head = when + fields + ',"line":'
        dumps = _DUMPS
        last = len(pieces) - 1
        for index, (piece, more) in enumerate(pieces):
            at = self._next_time(chunk.app, now)
            tail = ',"more":true}\n' if more else "}\n"
            if index == last:
                tail = f',"o":{stream.received}' + tail
            out.append(f'{{"ts":{at}{head}{dumps(piece)}{tail}'.encode())
        return stream

    def _wrapped(self, line: str, more: bool) -> Iterable[tuple[str, bool]]:
        """`line` in pieces of at most `max_line` characters; all but the last go on."""
        cut = self._max_line
        starts = range(0, max(len(line), 1), cut)
        for start in starts:
            yield line[start : start + cut], more or start + cut < len(line)

    def _next_time(self, app: str, now: float) -> str:
        """`now`, or a microsecond after the app's last line's time when the clock is not
        past it, as the seconds a line's `ts` says: counted in whole microseconds, so that
        each line's differs from the one before also once printed."""
        micros = max(int(now * 1e6), self._last.get(app, -1) + 1)
        self._last[app] = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def _make_room(self) -> None:
        while len(self._streams) >= self._max_sandboxes:
            finished = [s for s in self._streams.values() if s.finished_at is not None]
            if finished:
                victim = min(finished, key=lambda s: (s.finished_at, s.seq))
            else:
                victim = min(self._streams.values(), key=lambda s: (s.last_write, s.seq))
            del self._streams[victim.sandbox_id]

    def take_access(self, ingress: str, lines: list[dict[str, object]]) -> None:
        """An ingress's access lines (`Activator.access_sink`), to each app's access log.
        Not waited for: they are best effort, as the traffic reports they travel with. A line
        whose time is not within `ACCESS_SKEW` of this clock (an ingress's clock far off, or
        a forged time) gets this clock's: segments are named and kept by their lines' times."""
        now = self._clock()
        per_app: dict[str, list[dict[str, object]]] = {}
        for line in lines:
            per_app.setdefault(str(line["app"]), []).append(line)
        for app, found in per_app.items():
            encoded = []
            times = []
            for line in found:
                ts = line.get("ts")
                at = float(ts) if isinstance(ts, int | float) else now
                if not max(0.0, now - ACCESS_SKEW) <= at <= now + ACCESS_SKEW:
                    at = now
                times.append(at)
                encoded.append(encode({**line, "ts": at, "time": iso(at), "ingress": ingress}))
            self.logdir.append(app, "access", encoded, min(times), max(times))

    # -- reading ------------------------------------------------------------------------------

    def app_of(self, sandbox_id: str) -> str | None:
        stream = self._streams.get(sandbox_id)
        return None if stream is None else stream.app

    def node(self, name: str) -> NodeShipping | None:
        return self._nodes.get(name)

    def behind(self, app: str, nodes: Iterable[str], now: float) -> list[str]:
        """Why the app's log may lack lines: `nodes` (those running its sandboxes) not heard
        from lately or holding output back, and bytes of its sandboxes that never arrived."""
        notes = []
        for name in sorted(set(nodes)):
            shipping = self._nodes.get(name)
            if shipping is None:
                if now - self._since > STALE_INTERVALS * DEFAULT_INTERVAL:
                    notes.append(f"{name}: no batch received")
                continue
            age = now - shipping.last_batch_at
            if age > STALE_INTERVALS * shipping.interval:
                notes.append(f"{name}: last batch {age:.0f} s ago")
            if shipping.pending:
                notes.append(f"{name}: {shipping.pending} bytes not shipped yet")
        for stream in sorted(self._streams.values(), key=lambda s: s.seq):
            if stream.app == app and stream.missing:
                notes.append(f"{stream.sandbox_id}: {stream.missing} bytes missing")
        return notes
