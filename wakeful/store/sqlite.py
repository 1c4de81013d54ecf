"""The embedded engine: one SQLite file in WAL mode, for a single machine.

Every call runs on the store's one dedicated thread (see `local.py`) and every commit is one
SQLite transaction (`BEGIN IMMEDIATE`), so checks and writes are atomic and a crash leaves
either all of a commit or none of it. `synchronous=NORMAL` in WAL mode survives a process
crash; a power cut may lose the last commits, never corrupt the file.

Tables: `kv` (current values), `events` (history for watchers, trimmed by compaction),
`leases` (TTL leases, with wall-clock deadlines so they survive a restart), `meta`
(the revision counter and the compaction point).

Every `sqlite3` error is translated at this boundary: a locked database (another process holds
a write lock past `busy_timeout`), a full disk or an I/O error becomes `Unavailable`, which
callers retry; no `sqlite3` exception ever leaves this module.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from .base import Delete, Event, RawOp, RawPut, Require, prefix_end
from .errors import Conflict, LeaseNotFound, Unavailable
from .local import Compacted

P = ParamSpec("P")
R = TypeVar("R")


def _translated(method: Callable[P, R]) -> Callable[P, R]:
    """Turn any `sqlite3.Error` raised by `method` into the store's `Unavailable`."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            raise Unavailable(f"sqlite: {exc}") from exc

    return call


_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    lease INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease) WHERE lease IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    revision INTEGER NOT NULL,
    key TEXT NOT NULL,
    value BLOB,
    PRIMARY KEY (revision, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ttl INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('revision', 0), ('compacted', 1);
"""


def _create_private(path: Path) -> None:
    """Create the database file 0600 (in a 0700 directory when that is new) before SQLite
    opens it: SQLite gives its `-wal` and `-shm` files the database file's permissions, so
    none of the three is readable by other users, whatever the process's umask."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class SqliteEngine:
    @_translated
    def __init__(self, path: str | Path, *, busy_timeout: float = 5.0) -> None:
        """`busy_timeout`: how long a write waits for another process's lock before the
        call fails with `Unavailable`."""
        self._path = str(path)
        if self._path != ":memory:":
            _create_private(Path(self._path))
        self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        self._db.executescript(_SCHEMA)

    def _meta(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return int(row[0])

    @_translated
    def current(self) -> int:
        return self._meta("revision")

    @_translated
    def outside_version(self) -> int:
        """A number that changes when another connection (another process) commits to the
        file, and only then (SQLite's `data_version`): how a store sees others' writes."""
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    @_translated
    def get(self, key: str) -> tuple[bytes, int] | None:
        row = self._db.execute("SELECT value, revision FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    @_translated
    def scan(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]:
        end = prefix_end(prefix)
        self._db.execute("BEGIN")
        try:
            if end is None:
                cursor = self._db.execute("SELECT key, value, revision FROM kv ORDER BY key")
            else:
                cursor = self._db.execute(
                    "SELECT key, value, revision FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                    (prefix, end),
                )
            rows = [(str(k), bytes(v), int(r)) for k, v, r in cursor]
            return rows, self.current()
        finally:
            self._db.execute("COMMIT")

    @_translated
    def commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        db = self._db
        with self._transaction():
            for check in require:
                row = db.execute("SELECT revision FROM kv WHERE key = ?", (check.key,)).fetchone()
                current = 0 if row is None else int(row[0])
                if current != check.revision:
                    raise Conflict(check.key, current, check.revision)
            for op in ops:
                if not isinstance(op, RawPut) or op.lease is None:
                    continue
                if db.execute("SELECT 1 FROM leases WHERE id = ?", (op.lease,)).fetchone() is None:
                    raise LeaseNotFound(f"lease {op.lease} does not exist or has expired")
            revision = self.current() + 1
            deleted = self._apply(revision, ops)
            if deleted or any(isinstance(op, RawPut) for op in ops):
                db.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))
            else:
                revision -= 1  # nothing changed: the store is where it was
        # Read inside the transaction: another process may commit right after it.
        return revision, deleted

    def _apply(self, revision: int, ops: Sequence[RawOp]) -> int:
        deleted = 0
        for op in ops:
            if isinstance(op, Delete):
                if self._db.execute("DELETE FROM kv WHERE key = ?", (op.key,)).rowcount:
                    deleted += 1
                    self._db.execute("INSERT INTO events VALUES (?, ?, NULL)", (revision, op.key))
                continue
            self._db.execute(
                "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?)",
                (op.key, op.data, revision, op.lease),
            )
            self._db.execute("INSERT INTO events VALUES (?, ?, ?)", (revision, op.key, op.data))
        return deleted

    @_translated
    def changes(self, prefix: str, from_revision: int, span: int) -> tuple[list[Event], int]:
        # One read transaction: another process compacting between the check and the read
        # would otherwise take events from under a watcher that is told nothing.
        self._db.execute("BEGIN")
        try:
            return self._changes(prefix, from_revision, span)
        finally:
            self._db.execute("COMMIT")

    def _changes(self, prefix: str, from_revision: int, span: int) -> tuple[list[Event], int]:
        compacted = self._meta("compacted")
        current = self.current()
        if from_revision < compacted:
            raise Compacted(compacted, current)
        until = min(from_revision + span, current + 1)
        end = prefix_end(prefix)
        query = "SELECT revision, key, value FROM events WHERE revision >= ? AND revision < ?"
        args: tuple[object, ...] = (from_revision, until)
        if end is not None:
            query += " AND key >= ? AND key < ?"
            args += (prefix, end)
        rows = self._db.execute(query + " ORDER BY revision, key", args).fetchall()
        events = [
            Event(
                "delete" if value is None else "put",
                str(key),
                int(rev),
                None if value is None else bytes(value),
            )
            for rev, key, value in rows
        ]
        return events, max(until, from_revision)

    @_translated
    def compact(self, revision: int) -> None:
        # Checked inside the write transaction: another process may have compacted further
        # since a check outside it, and the compaction point never moves back.
        with self._transaction():
            current = self.current()
            if revision > current:
                raise ValueError(f"cannot compact to {revision}: the store is at {current}")
            if revision <= self._meta("compacted"):
                return
            self._db.execute("DELETE FROM events WHERE revision < ?", (revision,))
            self._db.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (revision,))

    @_translated
    def grant(self, ttl: int, now: float) -> int:
        with self._transaction():
            cursor = self._db.execute(
                "INSERT INTO leases (ttl, expires_at) VALUES (?, ?)", (ttl, now + ttl)
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    @_translated
    def keep_alive(self, lease: int, now: float) -> None:
        with self._transaction():
            updated = self._db.execute(
                "UPDATE leases SET expires_at = ? + ttl WHERE id = ? AND expires_at > ?",
                (now, lease, now),
            ).rowcount
        if not updated:
            raise LeaseNotFound(f"lease {lease} does not exist or has expired")

    @_translated
    def revoke(self, lease: int) -> bool:
        with self._transaction():
            return self._revoke(lease)

    def _revoke(self, lease: int) -> bool:
        self._db.execute("DELETE FROM leases WHERE id = ?", (lease,))
        keys = [
            str(row[0])
            for row in self._db.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease,))
        ]
        if not keys:
            return False
        revision = self.current() + 1
        self._apply(revision, [Delete(key) for key in keys])
        self._db.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))
        return True

    @_translated
    def expire(self, now: float) -> bool:
        with self._transaction():
            expired = [
                int(row[0])
                for row in self._db.execute("SELECT id FROM leases WHERE expires_at <= ?", (now,))
            ]
            changed = False
            for lease in expired:
                changed = self._revoke(lease) or changed
            return changed

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    @_translated
    def close(self) -> None:
        self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self._rollback()
            return
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error:
            # A failed COMMIT (disk full, I/O error) may leave the transaction open; end it,
            # or the next BEGIN on this connection fails too.
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
