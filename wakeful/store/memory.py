"""The in-memory engine: dictionaries and an event list, for tests and throwaway runs.

It keeps the same contract as etcd (one revision per commit, history, TTL leases), so a
component tested on it behaves the same on the others.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Delete, Event, RawOp, RawPut, Require, prefix_end
from .errors import Conflict, LeaseNotFound
from .local import Compacted


@dataclass(slots=True)
class _Entry:
    data: bytes
    revision: int
    lease: int | None


@dataclass(slots=True)
class _Lease:
    ttl: int
    expires_at: float
    keys: set[str]


class MemoryEngine:
    def __init__(self) -> None:
        self._revision = 0
        self._compacted = 1
        self._data: dict[str, _Entry] = {}
        self._events: list[Event] = []
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(1)

    def current(self) -> int:
        return self._revision

    def get(self, key: str) -> tuple[bytes, int] | None:
        entry = self._data.get(key)
        return None if entry is None else (entry.data, entry.revision)

    def scan(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        end = prefix_end(prefix)
        rows = [
            (key, entry.data, entry.revision)
            for key, entry in self._data.items()
            if key >= prefix and (end is None or key < end)
        ]
        rows.sort()
        return rows, self._revision

    def commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        for check in require:
            entry = self._data.get(check.key)
            current = 0 if entry is None else entry.revision
            if current != check.revision:
                raise Conflict(check.key, current, check.revision)
        for op in ops:
            if isinstance(op, RawPut) and op.lease is not None and op.lease not in self._leases:
                raise LeaseNotFound(f"lease {op.lease} does not exist or has expired")
        revision = self._revision + 1
        deleted = 0
        events: list[Event] = []
        for op in ops:
            if isinstance(op, Delete):
                if self._remove(op.key):
                    deleted += 1
                    events.append(Event("delete", op.key, revision, None))
                continue
            self._remove(op.key)
            self._data[op.key] = _Entry(op.data, revision, op.lease)
            if op.lease is not None:
                self._leases[op.lease].keys.add(op.key)
            events.append(Event("put", op.key, revision, op.data))
        if events:
            self._revision = revision
            events.sort(key=lambda event: event.key)
            self._events.extend(events)
        return self._revision, deleted

    def _remove(self, key: str) -> bool:
        entry = self._data.pop(key, None)
        if entry is None:
            return False
        if entry.lease is not None and entry.lease in self._leases:
            self._leases[entry.lease].keys.discard(key)
        return True

    def changes(self, prefix: str, from_revision: int, span: int) -> tuple[list[Event], int]:
        if from_revision < self._compacted:
            raise Compacted(self._compacted, self._revision)
        until = min(from_revision + span, self._revision + 1)
        start = bisect.bisect_left(self._events, from_revision, key=lambda e: e.revision)
        stop = bisect.bisect_left(self._events, until, key=lambda e: e.revision)
        end = prefix_end(prefix)
        found = [
            event
            for event in self._events[start:stop]
            if event.key >= prefix and (end is None or event.key < end)
        ]
        return found, max(until, from_revision)

    def compact(self, revision: int) -> None:
        if revision > self._revision:
            raise ValueError(f"cannot compact to {revision}: the store is at {self._revision}")
        if revision <= self._compacted:
            return
        cut = bisect.bisect_left(self._events, revision, key=lambda e: e.revision)
        del self._events[:cut]
        self._compacted = revision

    def grant(self, ttl: int, now: float) -> int:
        lease = next(self._lease_ids)
        self._leases[lease] = _Lease(ttl, now + ttl, set())
        return lease

    def keep_alive(self, lease: int, now: float) -> None:
        found = self._leases.get(lease)
        if found is None or found.expires_at <= now:
            raise LeaseNotFound(f"lease {lease} does not exist or has expired")
        found.expires_at = now + found.ttl

    def revoke(self, lease: int) -> bool:
        found = self._leases.pop(lease, None)
        if found is None or not found.keys:
            return False
        self.commit([], [Delete(key) for key in sorted(found.keys)])
        return True

    def expire(self, now: float) -> bool:
        expired = [lease for lease, found in self._leases.items() if found.expires_at <= now]
        changed = False
        for lease in expired:
            changed = self.revoke(lease) or changed
        return changed

    def outside_version(self) -> int:
        return 0  # no other process reaches memory

    def close(self) -> None:
        self._data.clear()
        self._events.clear()
