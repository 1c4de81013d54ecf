"""A store for one machine, over a synchronous engine (in memory, or a SQLite file).

Theory of operation: the engine is a plain synchronous object that does every check and
write of a commit in one step, so compare-and-set is atomic by construction (the memory
engine runs on the event loop without awaiting; the SQLite engine runs every call on one
dedicated thread, inside one SQLite transaction). The engine keeps an event log of recent
revisions; watchers read the log from their next revision and park on a notification that
every write fires. Housekeeping (`run`) expires TTL leases and trims the log; a watcher that
falls behind the trimmed log gets `Resync`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from .base import Event, RawOp, Require, Resync, StoreBase, WatchItem
from .errors import StoreError, Unavailable

R = TypeVar("R")
log = logging.getLogger(__name__)

DEFAULT_HISTORY = 10_000
"""Revisions of change history kept for watchers that fall behind."""


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
    ) -> None:
        self._engine = engine
        self._executor = ThreadPoolExecutor(1, "wakeful-store") if threaded else None
        self._clock = clock
        self._history = history
        self._tick = tick
        self._changed = asyncio.Event()
        self._closed = False

    async def _call(self, fn: Callable[..., R], *args: object) -> R:
        if self._closed:
            raise Unavailable("the store is closed")
        if self._executor is None:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _notify(self) -> None:
        fired, self._changed = self._changed, asyncio.Event()
        fired.set()

    async def _get(self, key: str) -> tuple[bytes, int] | None:
        return await self._call(self._engine.get, key)

    async def _list(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        return await self._call(self._engine.scan, prefix)

    async def _commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        try:
            return await self._call(self._engine.commit, require, ops)
        finally:
            self._notify()

    async def _watch(self, prefix: str, from_revision: int | None) -> AsyncIterator[WatchItem]:
        if from_revision is None:
            from_revision = await self._call(self._engine.current) + 1
        position = from_revision
        while True:
            # Take the notification before reading, so a write between the read and the
            # wait still wakes us.
            changed = self._changed
            try:
                events, position_after = await self._call(
                    self._engine.changes, prefix, position, 1024
                )
            except Compacted as exc:
                yield Resync(exc.current, str(exc))
                return
            for event in events:
                yield event
            caught_up = position_after > await self._call(self._engine.current)
            position = position_after
            if caught_up:
                await changed.wait()
                if self._closed:
                    raise Unavailable("the store was closed while watching")

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
        """Housekeeping until cancelled; runs in the task group that owns the store.

        A store error (a database locked by another process, a full disk) never ends it:
        it backs off, up to 5 s between tries, and tries again (invariant 19)."""
        backoff = self._tick
        while True:
            try:
                await self.housekeep()
                backoff = self._tick
            except StoreError as exc:
                if self._closed:
                    return
                backoff = min(backoff * 2, 5.0)
                log.warning("store housekeeping failed, retrying in %.1f s: %s", backoff, exc)
            await asyncio.sleep(backoff)

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
