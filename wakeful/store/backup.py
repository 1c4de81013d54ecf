"""Backups of a store's records, their restore, and the schema version a store's data has.

A backup is logical, not a copy of the database: every record under the namespace, as its
JSON, read in one listing (one revision: a consistent cut), written to a file through a
temporary file, fsync and rename. So one format serves all three backends, and a backup of
`wakeful up`'s SQLite store restores into etcd (the way from one machine to several). Records
bound to a TTL lease (`nodes/`, `leaders/`) are left out: they belong to processes that are
not in a backup, and come back when those processes do.

    {"format": "wakeful-backup", "version": 1, "schema": 1, "revision": R, "records": N,
     "blobs": B}
    {"key": "apps/hello", "value": {...}}
    ...
    {"blob": "<sha256>", "data": "<base64>"}
    ...

The blobs are the artifacts the versions name and the state archives stateful apps' records
name, when the caller can read them (`blobs`): a store's records without them would restore
apps no node can run.

`restore` writes into an empty store only (or over an unfinished restore of its own). It
marks the store first (`meta/restore`), writes the records in batches that each create only
absent keys, and clears the mark in the same transaction as the last batch, writing the schema
version: a control plane refuses to start on a store whose restore did not finish
(`check_schema`), so nothing half-restored is ever served.

The schema version (`meta/schema`) says which wakeful wrote the store's data. `check_schema`,
run as a control plane starts, writes it into a new store, migrates an older store's data (a
store from before versions is version 0: nothing to change) and refuses a newer one's with a
message naming both versions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
from pydantic import BaseModel, Field

from wakeful.domain import keys

from .base import MAX_VALUE_BYTES, Delete, Put, RawOp, RawPut, Require, StoreBase, check_key
from .errors import StoreError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SCHEMA_KEY = "meta/schema"
RESTORE_KEY = "meta/restore"
FORMAT = "wakeful-backup"
FORMAT_VERSION = 1
EPHEMERAL = (keys.NODES, keys.LEADERS, keys.UI_SESSION_KEY)
"""Never in a backup: records bound to a TTL lease, and the dashboard's session key (with the
token digests beside it, a backup's reader could make sessions; a restored cluster makes a new
one, and sessions end)."""
BATCH = 100
"""Records written per transaction (etcd takes at most 128 operations in one)."""


class Schema(BaseModel):
    version: int = Field(ge=0)
    written_at: float = 0.0


class RestoreMark(BaseModel):
    started_at: float = 0.0
    records: int = 0


class BackupError(Exception):
    """A backup or restore that cannot be done; the message says why, naming the file or the
    store. Nothing was written to the store."""


class SchemaError(StoreError):
    """The store's data is of a schema this wakeful cannot use."""


@dataclass(frozen=True)
class Summary:
    records: int
    revision: int
    schema: int
    blobs: int = 0


ReadBlob = Callable[[str], Awaitable[bytes | None]]
"""An artifact's bytes by sha256, None when it is not there."""
WriteBlob = Callable[[str, bytes], Awaitable[None]]


Migration = Callable[[StoreBase], Awaitable[None]]


async def _nothing(store: StoreBase) -> None:
    return None


MIGRATIONS: dict[int, Migration] = {0: _nothing}
"""From each version to the next: version 0 is a store from before versions were written,
whose records are those of version 1."""


async def check_schema(store: StoreBase) -> int:
    """Make the store's schema this wakeful's, or refuse it (`SchemaError`). Returns the
    version found before (0: none was written)."""
    mark = await store._get(RESTORE_KEY)
    if mark is not None:
        raise SchemaError(
            "a restore into this store did not finish: run `wakeful restore FILE` again (it "
            "starts over), or point this at another store"
        )
    found = await store.get(SCHEMA_KEY, Schema)
    version = found.value.version if found is not None else 0
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"the store's data is of schema {version}, written by a newer wakeful; this one "
            f"knows schema {SCHEMA_VERSION} at most: upgrade it (or restore a backup taken "
            "before the newer wakeful ran)"
        )
    if found is not None and version == SCHEMA_VERSION:
        return version
    start = version
    if found is None:
        rows, _ = await store._list("")
        if all(key.startswith(EPHEMERAL) for key, _, _ in rows):  # a new store: no data
            start = SCHEMA_VERSION
    for step in range(start, SCHEMA_VERSION):
        await MIGRATIONS[step](store)
        log.warning("migrated the store's data from schema %d to %d", step, step + 1)
    current = Schema(version=SCHEMA_VERSION, written_at=time.time())
    await store.txn(
        [Require(SCHEMA_KEY, found.revision if found is not None else 0)],
        [Put(SCHEMA_KEY, current)],
    )
    return version


async def backup(store: StoreBase, path: Path, blobs: ReadBlob | None = None) -> Summary:
    """Every record of the store but the ephemeral ones, at one revision, into `path`; with
    `blobs`, the artifacts the versions name too (`BackupError` when one is missing)."""
    rows, revision = await store._list("")
    kept = [(key, data) for key, data, _ in rows if not key.startswith(EPHEMERAL)]
    schema = 0  # no version written: a store from before versions
    digests: set[str] = set()
    for key, data in kept:
        if key == SCHEMA_KEY:
            schema = Schema.model_validate_json(data).version
        if key == RESTORE_KEY:
            raise BackupError("the store holds an unfinished restore: nothing to back up")
        for prefix, field in ((keys.VERSIONS, "artifact"), (keys.STATES, "archive")):
            if key.startswith(prefix):  # an artifact, or a stateful app's latest archive
                digest = json.loads(data).get(field)
                if isinstance(digest, str):
                    digests.add(digest)
    found: list[tuple[str, bytes]] = []
    if blobs is not None:
        for digest in sorted(digests):
            blob = await blobs(digest)
            if blob is None:
                raise BackupError(f"artifact {digest}, which a version names, is not stored")
            found.append((digest, blob))
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "schema": schema,
        "revision": revision,
        "records": len(kept),
        "blobs": len(found),
        "taken_at": time.time(),
    }
    await anyio.to_thread.run_sync(_write, path, header, kept, found)
    return Summary(len(kept), revision, schema, len(found))


def _write(
    path: Path,
    header: dict[str, object],
    kept: list[tuple[str, bytes]],
    found: list[tuple[str, bytes]],
) -> None:
    """The backup file, whole or not at all: a temporary file, fsync, rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # Created 0600 (tokens' digests, apps' environments), never through a planted link.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with open(os.open(temporary, flags, 0o600), "w", encoding="utf-8") as out:
            out.write(json.dumps(header) + "\n")
            for key, data in kept:
                out.write(json.dumps({"key": key, "value": json.loads(data)}) + "\n")
            for digest, data in found:
                encoded = base64.b64encode(data).decode()
                out.write(json.dumps({"blob": digest, "data": encoded}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class BackupFile:
    header: dict[str, object]
    records: list[tuple[str, bytes]]
    blobs: list[tuple[str, bytes]]


def read_backup(path: Path) -> BackupFile:
    """A backup file's header, records and blobs; `BackupError` naming what is wrong."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BackupError(f"{path}: cannot read it: {exc}") from None
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BackupError(f"{path}: not a wakeful backup (its first line is not the header)")
    if header.get("version") != FORMAT_VERSION:
        raise BackupError(f"{path}: backup format version {header.get('version')!r} is unknown")
    records: list[tuple[str, bytes]] = []
    blobs: list[tuple[str, bytes]] = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            record = json.loads(line)
            if "blob" in record:
                digest, data = record["blob"], base64.b64decode(record["data"], validate=True)
                if hashlib.sha256(data).hexdigest() != digest:
                    raise ValueError(f"artifact {str(digest)[:64]} does not match its sha256")
                blobs.append((digest, data))
                continue
            key, value = check_key(record["key"]), record["value"]
            data = json.dumps(value, separators=(",", ":")).encode()
            if len(data) > MAX_VALUE_BYTES:
                raise ValueError(f"{key!r} is {len(data)} bytes")
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise BackupError(f"{path}, line {number}: not a record ({exc})") from None
        records.append((key, data))
    if header.get("records") != len(records) or header.get("blobs", 0) != len(blobs):
        raise BackupError(
            f"{path}: the header says {header.get('records')} records and "
            f"{header.get('blobs', 0)} artifacts, the file holds {len(records)} and "
            f"{len(blobs)}: it is cut short"
        )
    schema = header.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise BackupError(
            f"{path}: its data is of schema {schema!r}; this wakeful knows schema "
            f"{SCHEMA_VERSION} at most"
        )
    return BackupFile(header, records, blobs)


async def restore(store: StoreBase, path: Path, blobs: WriteBlob | None = None) -> Summary:
    """The records of a backup into an empty store (see the module's notes); with `blobs`,
    its artifacts too, before any record (a version never names a missing one)."""
    read = await anyio.to_thread.run_sync(read_backup, path)  # it may be large
    header, records = read.header, read.records
    rows, _ = await store._list("")
    present = [key for key, _, _ in rows if not key.startswith(EPHEMERAL)]
    unfinished = RESTORE_KEY in present
    if present and not unfinished:
        raise BackupError(
            f"the store is not empty ({len(present)} records): restore into an empty store "
            "(a new etcd namespace, or a new data directory)"
        )
    if unfinished:  # an earlier restore stopped half-way: start over
        for start in range(0, len(present), BATCH):
            await store._commit([], [Delete(key) for key in present[start : start + BATCH]])
    mark = RestoreMark(started_at=time.time(), records=len(records))
    await store.create(RESTORE_KEY, mark)
    if blobs is not None:
        for digest, data in read.blobs:
            await blobs(digest, data)
    writes = [
        RawPut(key, data, None)
        for key, data in records
        if key not in (SCHEMA_KEY, RESTORE_KEY) and not key.startswith(EPHEMERAL)
    ]
    schema = Schema(version=int(str(header["schema"])), written_at=time.time())
    last: list[RawOp] = [
        Delete(RESTORE_KEY),
        RawPut(SCHEMA_KEY, schema.model_dump_json().encode(), None),
    ]
    batches = [writes[at : at + BATCH] for at in range(0, len(writes), BATCH)] or [[]]
    revision = 0
    for number, batch in enumerate(batches):
        ops: list[RawOp] = [*batch, *(last if number == len(batches) - 1 else [])]
        require = [Require(op.key, 0) for op in batch]
        revision, _ = await store._commit(require, ops)
    return Summary(len(writes), revision, schema.version, len(read.blobs) if blobs else 0)
