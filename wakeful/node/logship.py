"""Shipping sandbox output from the node to the control plane: bounded, batched, pushed.

Theory of operation:
- Each sandbox's pump hands every chunk it reads to `LogShipper.open(...)`'s writer, which
  appends it to that sandbox's `OutputBuffer`. A buffer never holds more than its limit: when
  full, the oldest bytes go and are counted. Appending never awaits, so a slow or absent
  control plane can never hold up a sandbox's output pipe.
- One loop (`LogShipper.run`, in the agent's task group) flushes every `interval` seconds, or
  at once when a buffer passes `eager_bytes`: one `LogBatch` of at most `MAX_BATCH_BYTES`,
  through a `LogSink`. Bytes leave a buffer only once the sink took them; on failure they
  stay (still bounded) and the loop backs off, up to `max_backoff` seconds, and tries again.
  Nothing the sink raises ends the loop: an outage never takes the agent down.
- A chunk carries the byte offsets it covers, so a batch sent twice or a gap left by dropped
  bytes is visible to the receiver. Chunks end on a UTF-8 character boundary.
- While any sandbox is open the node ships every interval, an empty batch if need be, so the
  control plane can tell "no output" from "no word from this node".
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from wakeful.domain.backoff import Backoff, Retries
from wakeful.domain.logbatch import MAX_BATCH_BYTES, LogBatch, OutputChunk, ShipFailed

log = logging.getLogger(__name__)

BUFFER_BYTES = 256 * 1024
EAGER_BYTES = 32 * 1024
MAX_FINISHED = 32
"""Ended sandboxes whose output is still waiting to be shipped; past it the oldest goes."""


class LogSink(Protocol):
    """Where a node's batches go: the control plane's log book, in-process or over HTTP.

    `ship` returns once the batch is taken, or raises `ShipFailed`."""

    async def ship(self, batch: LogBatch) -> None: ...


def utf8_cut(data: bytes | bytearray, n: int) -> int:
    """The largest length <= n that does not end inside a UTF-8 character."""
    for i in range(n - 1, max(n - 4, 0) - 1, -1):
        byte = data[i]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        need = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if byte < 0xF8 else 1
        return i if i + need > n and byte >= 0xC0 else n
    return n


@dataclass(frozen=True)
class Slice:
    offset: int
    data: bytes
    final: bool


class OutputBuffer:
    """Output not shipped yet, at most `limit` bytes; the oldest bytes go first.

    Offsets are absolute positions in the sandbox's output stream. `dropped` counts bytes
    lost for good: those dropped while a slice holding them is in flight only count if that
    slice fails.
    """

    def __init__(self, limit: int = BUFFER_BYTES) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be at least 1 (got {limit})")
        self.limit = limit
        self.start = 0
        self.dropped = 0
        self.finished = False
        self._data = bytearray()
        self._in_flight = 0
        """Bytes below this offset are in a slice being shipped."""

    def __len__(self) -> int:
        return len(self._data)

    def append(self, chunk: bytes) -> int:
        """Add output; returns how many bytes were dropped for good to make room."""
        self._data += chunk
        excess = len(self._data) - self.limit
        if excess <= 0:
            return 0
        del self._data[:excess]
        old, self.start = self.start, self.start + excess
        lost = self.start - max(old, min(self._in_flight, self.start))
        self.dropped += lost
        return lost

    def take(self, max_bytes: int) -> Slice:
        """The oldest output, up to `max_bytes`; it stays here until `shipped`."""
        n = min(len(self._data), max(0, max_bytes))
        final = self.finished and n == len(self._data)
        if not final:
            n = utf8_cut(self._data, n)
        self._in_flight = self.start + n
        return Slice(self.start, bytes(self._data[:n]), final)

    def shipped(self, piece: Slice) -> None:
        cut = piece.offset + len(piece.data) - self.start
        if cut > 0:
            del self._data[:cut]
            self.start += cut
        self._in_flight = 0

    def failed(self, piece: Slice) -> int:
        """The slice did not arrive: bytes of it dropped meanwhile are lost now."""
        lost = max(0, min(self.start, piece.offset + len(piece.data)) - piece.offset)
        self.dropped += lost
        self._in_flight = 0
        return lost


@dataclass
class _Open:
    app: str
    created_at: float
    buffer: OutputBuffer
    version: str = ""


class LogShipper:
    def __init__(
        self,
        sink: LogSink,
        node: str,
        *,
        interval: float = 1.0,
        buffer_bytes: int = BUFFER_BYTES,
        eager_bytes: int = EAGER_BYTES,
        batch_bytes: int = MAX_BATCH_BYTES,
        max_finished: int = MAX_FINISHED,
        max_backoff: float = 15.0,
        ship_timeout: float = 30.0,
    ) -> None:
        if not 0 < batch_bytes <= MAX_BATCH_BYTES:
            raise ValueError(f"batch_bytes: must be 1..{MAX_BATCH_BYTES} (got {batch_bytes})")
        self._sink = sink
        self._node = node
        self._interval = interval
        self._buffer_bytes = buffer_bytes
        self._eager_bytes = eager_bytes
        self._batch_bytes = batch_bytes
        self._max_finished = max_finished
        self._max_backoff = max_backoff
        self._ship_timeout = ship_timeout
        self._open: dict[str, _Open] = {}
        self._finished: list[str] = []
        """Ended sandboxes still holding output, oldest first (bounded by max_finished)."""
        self._evicted_bytes = 0
        self._wake = anyio.Event()
        self._lock = anyio.Lock()

    @property
    def pending(self) -> int:
        return sum(len(entry.buffer) for entry in self._open.values())

    @property
    def dropped(self) -> int:
        return self._evicted_bytes + sum(entry.buffer.dropped for entry in self._open.values())

    def open(
        self, sandbox_id: str, app: str, created_at: float, version: str = ""
    ) -> Callable[[bytes], None]:
        """A writer for the sandbox's output. Never blocks; bounded by `buffer_bytes`."""
        entry = self._open.get(sandbox_id)
        if entry is None:
            entry = self._open[sandbox_id] = _Open(
                app, created_at, OutputBuffer(self._buffer_bytes), version
            )
            self._wake.set()  # the control plane hears of a new sandbox at once
        buffer = entry.buffer

        def write(chunk: bytes) -> None:
            buffer.append(chunk)
            if len(buffer) >= self._eager_bytes:
                self._wake.set()

        return write

    def close(self, sandbox_id: str) -> None:
        """The sandbox ended: what it wrote is still shipped, then forgotten."""
        entry = self._open.get(sandbox_id)
        if entry is None or entry.buffer.finished:
            return
        entry.buffer.finished = True
        self._finished.append(sandbox_id)
        while len(self._finished) > self._max_finished:
            oldest = self._finished.pop(0)
            gone = self._open.pop(oldest)
            self._evicted_bytes += gone.buffer.dropped + len(gone.buffer)
            if len(gone.buffer):  # one with nothing left to ship is just forgotten
                log.warning(
                    "dropping %d bytes of output never shipped",
                    len(gone.buffer),
                    extra={"sandbox": oldest},
                )
        self._wake.set()

    def _plan(self) -> list[tuple[str, Slice]]:
        """What the next batch holds: the smallest backlogs whole, the rest an equal share
        of what is left of `batch_bytes`, so one chatty sandbox cannot starve the others."""
        entries = sorted(self._open.items(), key=lambda item: len(item[1].buffer))
        budget = self._batch_bytes
        taken = []
        for left, (sandbox_id, entry) in zip(range(len(entries), 0, -1), entries, strict=True):
            piece = entry.buffer.take(budget // left)
            budget -= len(piece.data)
            if piece.data or piece.final:
                taken.append((sandbox_id, piece))
        return taken

    def _chunk(self, sandbox_id: str, piece: Slice) -> OutputChunk:
        entry = self._open[sandbox_id]
        return OutputChunk(
            sandbox=sandbox_id,
            app=entry.app,
            version=entry.version,
            created_at=max(0.0, entry.created_at),
            offset=piece.offset,
            size=len(piece.data),
            text=piece.data.decode(errors="replace"),
            finished=piece.final,
        )

    async def flush(self) -> bool:
        """Ship one batch; True once the sink took it (or there was nothing to say)."""
        async with self._lock:
            if not self._open:
                return True
            taken = self._plan()
            chunks = [self._chunk(sandbox_id, piece) for sandbox_id, piece in taken]
            in_batch = sum(len(piece.data) for _, piece in taken)
            batch = LogBatch(
                node=self._node,
                interval=self._interval,
                pending=self.pending - in_batch,
                dropped=self.dropped,
                chunks=chunks,
            )
            failure: str | None = None
            try:
                with anyio.move_on_after(self._ship_timeout) as scope:
                    await self._sink.ship(batch)
                if scope.cancelled_caught:
                    failure = f"no answer within {self._ship_timeout:g} s"
            except ShipFailed as exc:
                failure = str(exc)
            except Exception as exc:  # a sink's bug must not stop the agent either
                log.exception("log sink failed")
                failure = repr(exc)
            for sandbox_id, piece in taken:
                still = self._open.get(sandbox_id)
                if still is None:  # evicted while in flight: counted as dropped then
                    continue
                if failure is None:
                    still.buffer.shipped(piece)
                    if piece.final:
                        del self._open[sandbox_id]
                        self._finished.remove(sandbox_id)
                else:
                    still.buffer.failed(piece)
            if failure is not None:
                log.warning("shipping output failed, will retry: %s", failure)
            return failure is None

    async def run(self) -> None:
        """Flush every interval, sooner when output piles up, backing off while failing."""
        retries = Retries(Backoff(min(2 * self._interval, self._max_backoff), self._max_backoff))
        delay = self._interval
        while True:
            if delay > self._interval:  # backing off: output arriving meanwhile waits
                await anyio.sleep(delay)
            else:
                with anyio.move_on_after(delay):
                    await self._wake.wait()
            self._wake = anyio.Event()
            if await self.flush():
                busy = any(len(e.buffer) >= self._eager_bytes for e in self._open.values())
                delay = 0 if busy else self._interval
                retries.succeeded()
            else:
                delay = retries.failed()
