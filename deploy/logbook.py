"""The control plane's record of its sandboxes' output: in memory, bounded, pushed by nodes.

Theory of operation:
- Nodes push `LogBatch`es (`wakeful.logbatch`): in `wakeful up` the in-process node agent
  hands them to `LogBook.ship` directly, elsewhere they arrive through `POST /v1/logs`. The
  book never calls a node.
- Per sandbox it keeps complete lines (at most `max_lines` lines and `max_bytes` bytes; the
  oldest go first) and one unterminated line (longer lines are wrapped at `max_line`).
  It holds at most `max_sandboxes` sandboxes: past that the one that finished first goes,
  or, when none has finished, the one written least recently. At most `max_nodes` nodes.
- Each chunk names the bytes of the output stream it holds, so a chunk sent twice (a retry
  after a lost answer) is recorded once, and bytes that never arrived leave a marker line
  and are counted as missing.
- Per node it records when the last batch arrived and what the node said was still pending
  and dropped; `behind` turns that into notes for a reader ("node-a: last batch 14 s ago").

`record` and `behind` take `now`: no clock is read inside, so tests drive time.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from wakeful.domain.logbatch import LogBatch, OutputChunk

MAX_LINES = 10_000
MAX_BYTES = 256 * 1024
MAX_LINE = 16 * 1024
MAX_SANDBOXES = 256
MAX_NODES = 1024
STALE_INTERVALS = 5
"""A node whose last batch is this many of its ship intervals old is behind."""
DEFAULT_INTERVAL = 1.0
"""The ship interval assumed of a node not heard from yet (`NodeSettings.log_ship_interval`)."""


@dataclass
class NodeShipping:
    last_batch_at: float
    interval: float
    pending: int
    dropped: int


@dataclass(eq=False)
class _Log:
    sandbox_id: str
    app: str
    node: str
    created_at: float
    seq: int
    last_write: float
    lines: deque[str] = field(default_factory=deque)
    size: int = 0
    partial: str = ""
    received: int = 0
    """Bytes of the sandbox's output stream accounted for (received or known missing)."""
    missing: int = 0
    finished_at: float | None = None


class LogBook:
    def __init__(
        self,
        *,
        max_lines: int = MAX_LINES,
        max_bytes: int = MAX_BYTES,
        max_line: int = MAX_LINE,
        max_sandboxes: int = MAX_SANDBOXES,
        max_nodes: int = MAX_NODES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in [
            ("max_lines", max_lines),
            ("max_bytes", max_bytes),
            ("max_line", max_line),
            ("max_sandboxes", max_sandboxes),
            ("max_nodes", max_nodes),
        ]:
            if value < 1:
                raise ValueError(f"{name}: must be at least 1 (got {value})")
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._max_line = max_line
        self._max_sandboxes = max_sandboxes
        self._max_nodes = max_nodes
        self._clock = clock
        self._since = clock()
        self._logs: dict[str, _Log] = {}
        self._nodes: dict[str, NodeShipping] = {}
        """In order of their last batch, oldest first."""
        self._seq = itertools.count()

    # -- the LogSink a node agent ships to ----------------------------------------------------

    async def ship(self, batch: LogBatch) -> None:
        self.record(batch, self._clock())

    def now(self) -> float:
        return self._clock()

    # -- writing ------------------------------------------------------------------------------

    def record(self, batch: LogBatch, now: float) -> None:
        self._nodes.pop(batch.node, None)
        self._nodes[batch.node] = NodeShipping(now, batch.interval, batch.pending, batch.dropped)
        while len(self._nodes) > self._max_nodes:
            del self._nodes[next(iter(self._nodes))]
        for chunk in batch.chunks:
            self._take(batch.node, chunk, now)

    def _take(self, node: str, chunk: OutputChunk, now: float) -> None:
        log = self._logs.get(chunk.sandbox)
        if log is None:
            self._make_room()
            log = self._logs[chunk.sandbox] = _Log(
                chunk.sandbox, chunk.app, node, chunk.created_at, next(self._seq), now
            )
        log.node = node
        log.last_write = now
        end = chunk.offset + chunk.size
        text = chunk.text
        if end <= log.received:
            text = ""  # sent before: a retry after a lost answer
        elif chunk.offset < log.received:
            overlap = log.received - chunk.offset  # partly sent before
            text = text.encode()[overlap:].decode(errors="replace")
        elif chunk.offset > log.received:
            gap = chunk.offset - log.received
            log.missing += gap
            self._end_line(log)
            self._push(log, f"[wakeful: {gap} bytes of output missing here]")
        log.received = max(log.received, end)
        if text:
            self._write(log, text)
        if chunk.finished and log.finished_at is None:
            self._end_line(log)
            log.finished_at = now

    def _make_room(self) -> None:
        while len(self._logs) >= self._max_sandboxes:
            finished = [log for log in self._logs.values() if log.finished_at is not None]
            if finished:
                victim = min(finished, key=lambda log: (log.finished_at, log.seq))
            else:
                victim = min(self._logs.values(), key=lambda log: (log.last_write, log.seq))
            del self._logs[victim.sandbox_id]

    def _write(self, log: _Log, text: str) -> None:
        *complete, log.partial = (log.partial + text).split("\n")
        for line in complete:
            self._push(log, line.removesuffix("\r"))
        while len(log.partial) > self._max_line:
            self._push(log, log.partial[: self._max_line])
            log.partial = log.partial[self._max_line :]

    def _end_line(self, log: _Log) -> None:
        if log.partial:
            self._push(log, log.partial.removesuffix("\r"))
            log.partial = ""

    def _push(self, log: _Log, line: str) -> None:
        for start in range(0, max(len(line), 1), self._max_line):
            piece = line[start : start + self._max_line]
            log.lines.append(piece)
            log.size += len(piece.encode()) + 1
        while log.lines and (len(log.lines) > self._max_lines or log.size > self._max_bytes):
            log.size -= len(log.lines.popleft().encode()) + 1

    # -- reading ------------------------------------------------------------------------------

    def knows(self, sandbox_id: str) -> bool:
        return sandbox_id in self._logs

    def node(self, name: str) -> NodeShipping | None:
        return self._nodes.get(name)

    def sandbox_lines(self, sandbox_id: str, tail: int) -> list[str]:
        log = self._logs.get(sandbox_id)
        return [] if log is None else _tail(log, tail)

    def app_lines(self, app: str, tail: int) -> list[str]:
        """The last `tail` lines of each of the app's sandboxes, `[sandbox-id] `-prefixed,
        in the order the sandboxes were created."""
        found = sorted(
            (log for log in self._logs.values() if log.app == app),
            key=lambda log: (log.created_at, log.seq),
        )
        return [f"[{log.sandbox_id}] {line}" for log in found for line in _tail(log, tail)]

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
        for log in sorted(self._logs.values(), key=lambda log: (log.created_at, log.seq)):
            if log.app == app and log.missing:
                notes.append(f"{log.sandbox_id}: {log.missing} bytes missing")
        return notes


def _tail(log: _Log, tail: int) -> list[str]:
    lines = [*log.lines, log.partial] if log.partial else list(log.lines)
    return lines[-tail:] if tail > 0 else []
