"""A store for one machine, over a synchronous engine (in memory, or a SQLite file).

Theory of operation: the engine is a plain synchronous object that does every check and
write of a commit in one step, so compare-and-set is atomic by construction (the memory
engine runs on the event loop without awaiting; the SQLite engine runs every call on one
dedicated thread, inside one SQLite transaction). The engine keeps an event log of recent
revisions; watchers read the log from their next revision and park on a notification that
every write fires. Housekeeping (`run`) expires TTL leases and trims the log; a watcher that
falls behind the trimmed log gets `Resync`.

The recent end of the log is also kept in memory (`_Tail`, the last `TAIL_EVENTS` events of every
key): after a write, the first watcher to wake reads the new events from the engine once and
every other watcher takes its own from memory. Without it each of a node's watchers (activator,
controller, node agent, ingress routes...) read the log twice per write through the store's one
thread, and a cold start, which is a chain of writes each waited on by the next piece, paid
that on every hop. A watcher behind the memory's start reads the engine, as before.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from wakeful.domain.backoff import Backoff, Retries

from .base import Event, RawOp, RawPut, Require, Resync, StoreBase, WatchItem
from .errors import StoreError, Unavailable
from .nudge import FileNudge

R = TypeVar("R")
log = logging.getLogger(__name__)

DEFAULT_HISTORY = 10_000
"""Revisions of change history kept for watchers that fall behind."""
SHARED_LOOK = 0.05
"""Seconds between two looks for another process's writes to a SQLite file where the kernel
cannot tell when it is written (no inotify): the lag a watcher here has behind them
(`wakeful up`'s ingress workers open its store)."""
NUDGED_LOOK = 1.0
"""Seconds between two looks when the kernel tells of each write (`store.nudge`): a fallback
only, for an event the kernel dropped."""
FOLLOW_UPS = (0.005,) + (SHARED_LOOK,) * 10
"""After a nudge, looks again this long after each look (sooner when nudged again): SQLite
writes a commit to the WAL a moment before its WAL index says it committed, and a look in
between sees nothing new. Usually the moment is microseconds; a writer held up inside it (a
CPU quota's pause) is still seen within `SHARED_LOOK` for half a second after."""
LOOK_GAP = 0.005
"""At least this long between two looks, however often the file is written: this process's
own writes nudge too, and each look is a turn on the store's thread its operations need."""
TAIL_EVENTS = 4096
"""Events kept in memory for watchers (at most twice that between trims)."""


class Compacted(Exception):
    """The engine no longer holds history from the revision asked for."""

    def __init__(self, compacted: int, current: int):
        self.compacted = compacted
        self.current = current
        super().__init__(f"history before revision {compacted} was compacted")


class Engine(Protocol):
    def current(self) -> int: ...

    def get(self, key: str) -> tuple[bytes, int] | None: ...

    def scan(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]: ...

    def commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]: ...

    def changes(self, prefix: str, from_revision: int, span: int) -> tuple[list[Event], int]:
        """Events under `prefix` in [from_revision, from_revision + span), and the revision
        to continue from. Raises Compacted when from_revision is older than the history."""
        ...

    def compact(self, revision: int) -> None: ...

    def grant(self, ttl: int, now: float) -> int: ...

    def keep_alive(self, lease: int, now: float) -> None: ...

    def revoke(self, lease: int) -> bool: ...

    def expire(self, now: float) -> bool: ...

    def outside_version(self) -> int:
        """Changes when another process commits to the same engine (never, in memory)."""
        ...

    def close(self) -> None: ...


class LocalStore(StoreBase):
    def __init__(
        self,
        engine: Engine,
        *,
        threaded: bool,
        clock: Callable[[], float] = time.time,
        history: int = DEFAULT_HISTORY,
        tick: float = 0.2,
        shared: float | None = None,
        watch: Path | None = None,
    ) -> None:
        """`shared`: seconds between two looks for other processes' writes to the engine
        (a SQLite file several processes open); None, when only this process writes.
        `watch`: that file, whose writes the kernel tells of (`store.nudge`): then a look
        follows each write, and `NUDGED_LOOK` apart otherwise."""
        self._engine = engine
        self._shared = shared
        self._watched = watch
        self._executor = ThreadPoolExecutor(1, "wakeful-store") if threaded else None
        self._clock = clock
        self._history = history
        self._tick = tick
        self._changed = asyncio.Event()
        self._generation = 0
        """Writes notified so far: a tail read at generation g has seen every one of them."""
        self._tail = _Tail()
        self._closed = False

    async def _call(self, fn: Callable[..., R], *args: object) -> R:
        if self._closed:
            raise Unavailable("the store is closed")
        if self._executor is None:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _notify(self) -> None:
        self._generation += 1
        fired, self._changed = self._changed, asyncio.Event()
        fired.set()

    async def _get(self, key: str) -> tuple[bytes, int] | None:
        return await self._call(self._engine.get, key)

    async def _list(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        return await self._call(self._engine.scan, prefix)

    async def _commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        done: tuple[int, int] | None = None
        try:
            done = await self._call(self._engine.commit, require, ops)
            return done
        finally:
            self._notify()
            if done is not None:
                self._tail.committed(done[0], ops, self._generation)

    async def _watch(self, prefix: str, from_revision: int | None) -> AsyncIterator[WatchItem]:
        if from_revision is None:
            from_revision = await self._call(self._engine.current) + 1
        position = from_revision
        while True:
            # Take the notification before reading, so a write between the read and the
            # wait still wakes us.
            changed, generation = self._changed, self._generation
            await self._refresh(generation)
            tail = self._tail
            if position >= tail.start:
                events, position_after = tail.since(prefix, position)
                caught_up = True
            else:
                try:
                    events, position_after = await self._call(
                        self._engine.changes, prefix, position, 1024
                    )
                except Compacted as exc:
                    yield Resync(exc.current, str(exc))
                    return
                caught_up = False  # the tail has the rest; the next round reads it there
            for event in events:
                yield event
            position = position_after
            if caught_up:
                await changed.wait()
                if self._closed:
                    raise Unavailable("the store was closed while watching")

    async def _refresh(self, generation: int) -> None:
        """Bring the tail up to the engine as it was at `generation` (or later): one reader
        at a time; the others wait for it and read nothing themselves."""
        tail = self._tail
        while tail.generation < generation:
            if tail.reading is not None:
                await asyncio.wait([tail.reading])  # its failure is its reader's to raise
                continue
            reading = asyncio.get_running_loop().create_future()
            tail.reading = reading
            started = self._generation
            try:
                if tail.next < 0:
                    tail.reset(await self._call(self._engine.current) + 1)
                while True:
                    try:
                        events, after = await self._call(self._engine.changes, "", tail.next, 1024)
                    except Compacted as exc:  # nobody read for a whole history: start over
                        tail.reset(exc.current + 1)
                        continue
                    full = after - tail.next >= 1024
                    tail.add(events, after)
                    if not full:
                        break
                tail.generation = started
            finally:
                tail.reading = None
                reading.set_result(None)

    async def grant(self, ttl: int) -> int:
        if ttl < 1:
            raise ValueError(f"ttl must be >= 1 second, got {ttl}")
        return await self._call(self._engine.grant, ttl, self._clock())

    async def keep_alive(self, lease: int) -> None:
        await self._call(self._engine.keep_alive, lease, self._clock())

    async def revoke(self, lease: int) -> None:
        if await self._call(self._engine.revoke, lease):
            self._notify()

    async def compact(self, revision: int) -> None:
        await self._call(self._engine.compact, revision)

    async def housekeep(self) -> None:
        """Expire TTL leases (their keys are deleted, with events) and trim history."""
        if await self._call(self._engine.expire, self._clock()):
            self._notify()
        current = await self._call(self._engine.current)
        if current > self._history:
            await self._call(self._engine.compact, current - self._history)

    async def run(self) -> None:
        """Housekeeping (and the look for others' writes, `shared`) until cancelled; runs in
        the task group that owns the store.

        A store error (a database locked by another process, a full disk) never ends it:
        it backs off, up to 5 s between tries, and tries again (invariant 19)."""
        if self._shared is None:
            await self._housekeeping()
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._housekeeping())
            tasks.create_task(self._follow_others(self._shared))

    async def _follow_others(self, interval: float) -> None:
        """Wake the watchers when another process has committed: they read its writes from
        the engine's log as they read this process's. A look follows each write the kernel
        tells of (and `FOLLOW_UPS` after it), else every `interval`. A failed look is skipped
        (the housekeeping reports the store's trouble)."""
        nudge: FileNudge | None = None
        if self._watched is not None:
            nudge = FileNudge(self._watched)
            if not nudge.start():
                log.info("no word of writes to %s: looking every %g s", self._watched, interval)
                nudge = None
        every = interval if nudge is None else max(interval, NUDGED_LOOK)
        loop = asyncio.get_running_loop()
        seen: int | None = None
        follow: list[float] = []
        try:
            while True:
                try:
                    version = await self._call(self._engine.outside_version)
                except StoreError:
                    if self._closed:
                        return
                else:
                    if version != seen:  # the first look too: a watch may have read before it
                        self._notify()
                    seen = version
                if nudge is None:
                    await asyncio.sleep(interval)
                    continue
                looked = loop.time()
                if await nudge.wait(follow.pop(0) if follow else every):
                    follow = list(FOLLOW_UPS)
                    if (gap := looked + LOOK_GAP - loop.time()) > 0:
                        await asyncio.sleep(gap)  # writes meanwhile: one look for them all
        finally:
            if nudge is not None:
                nudge.close()

    async def _housekeeping(self) -> None:
        retries = Retries(Backoff(min(2 * self._tick, 5.0), cap=5.0))
        while True:
            pause = self._tick
            try:
                await self.housekeep()
                retries.succeeded()
            except StoreError as exc:
                if self._closed:
                    return
                pause = retries.failed()
                log.warning("store housekeeping failed, retrying in %.1f s: %s", pause, exc)
            await asyncio.sleep(pause)

    async def aclose(self) -> None:
        if self._closed:
            return
        if self._executor is not None:
            await self._call(self._engine.close)
            self._executor.shutdown(wait=True)
        else:
            self._engine.close()
        self._closed = True
        self._notify()


class _Tail:
    """The recent end of the event log, every key: events with revision >= `start`, up to
    `next` (exclusive), ordered by revision."""

    def __init__(self) -> None:
        self.start = 1 << 62
        """No watcher reads here before the first refresh."""
        self.next = -1
        self.generation = -1
        self.reading: asyncio.Future[None] | None = None
        self._events: list[Event] = []
        self._revisions: list[int] = []

    def reset(self, revision: int) -> None:
        self.start = self.next = revision
        self._events, self._revisions = [], []

    def add(self, events: list[Event], after: int) -> None:
        self._events += events
        self._revisions += [event.revision for event in events]
        self.next = max(self.next, after)
        if len(self._events) > 2 * TAIL_EVENTS:
            cut = len(self._events) - TAIL_EVENTS
            while cut < len(self._events) and self._revisions[cut] == self._revisions[cut - 1]:
                cut += 1  # never half a revision
            self.start = self._revisions[cut] if cut < len(self._events) else self.next
            del self._events[:cut], self._revisions[:cut]

    def committed(self, revision: int, ops: Sequence[RawOp], generation: int) -> None:
        """Take a write's events from its own ops when the tail holds every revision before
        it and nobody is reading the engine: the watchers it wakes then read nothing there.
        Only for puts of distinct keys (a delete makes an event only if the key existed);
        otherwise the next reader reads the engine, as for any write."""
        if self.reading is not None or self.next != revision or not ops:
            return
        if self.generation != generation - 1:  # a notified write not read in yet: read it all
            return
        puts = [op for op in ops if isinstance(op, RawPut)]
        if len(puts) != len(ops) or len({op.key for op in puts}) != len(puts):
            return
        events = [Event("put", op.key, revision, op.data) for op in puts]
        self.add(sorted(events, key=lambda event: event.key), revision + 1)
        self.generation = generation

    def since(self, prefix: str, position: int) -> tuple[list[Event], int]:
        """Events under `prefix` from revision `position` on, and where to go on from."""
        first = bisect.bisect_left(self._revisions, position)
        found = [event for event in self._events[first:] if event.key.startswith(prefix)]
        return found, max(position, self.next)
