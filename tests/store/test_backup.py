"""Backups, restores and the schema version (`wakeful.store.backup`), on every backend: a
backup read from each restores into another store, and a file made elsewhere restores into
each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wakeful.domain import keys
from wakeful.domain.models import App, Leader, Node, Token
from wakeful.store import Conflict, Store, open_store
from wakeful.store.backup import (
    BATCH,
    RESTORE_KEY,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    BackupError,
    Schema,
    SchemaError,
    backup,
    check_schema,
    restore,
)
from wakeful.store.base import StoreBase

pytestmark = pytest.mark.anyio


async def fill(store: Store, apps: int = 3) -> None:
    for number in range(apps):
        await store.put(keys.app(f"app{number}"), App(name=f"app{number}"))
    await store.put(
        keys.token("edge"), Token(name="edge", role="ingress", id="0a1b2c3d", sha256="0" * 64)
    )
    lease = await store.grant(30)
    await store.put(keys.node("n1"), Node(name="n1", address="10.0.0.2"), lease=lease)
    await store.put(keys.leader("activator"), Leader(holder="a"), lease=lease)
    await check_schema(base(store))


def base(store: Store) -> StoreBase:
    assert isinstance(store, StoreBase)
    return store


async def records(store: Store) -> dict[str, bytes]:
    rows, _ = await base(store)._list("")
    return {key: data for key, data, _ in rows}


async def test_a_backup_restores_into_an_empty_store_without_its_ephemeral_records(
    store: Store, tmp_path: Path
) -> None:
    await fill(store)
    taken = await backup(base(store), tmp_path / "b.jsonl")
    assert taken.records == 5 and taken.schema == SCHEMA_VERSION  # 3 apps, a token, schema
    async with open_store("memory://") as target:
        restored = await restore(base(target), tmp_path / "b.jsonl")
        assert restored.records == 4
        found = await records(target)
    source = await records(store)
    kept = {k: v for k, v in source.items() if not k.startswith((keys.NODES, keys.LEADERS))}
    assert {k: json.loads(v) for k, v in found.items() if k != SCHEMA_KEY} == {
        k: json.loads(v) for k, v in kept.items() if k != SCHEMA_KEY
    }
    assert json.loads(found[SCHEMA_KEY])["version"] == SCHEMA_VERSION


async def test_a_backup_made_elsewhere_restores_into_each_store(
    store: Store, tmp_path: Path
) -> None:
    async with open_store("memory://") as source:
        await fill(source, apps=2 * BATCH + 5)  # several batches
        await backup(base(source), tmp_path / "b.jsonl")
    await restore(base(store), tmp_path / "b.jsonl")
    assert len((await store.list(keys.APPS, App)).items) == 2 * BATCH + 5
    assert await check_schema(base(store)) == SCHEMA_VERSION  # ready to be served
    assert await store.get(RESTORE_KEY, Schema) is None


async def test_a_restore_into_a_store_that_has_records_is_refused_and_writes_nothing(
    store: Store, tmp_path: Path
) -> None:
    async with open_store("memory://") as source:
        await fill(source)
        await backup(base(source), tmp_path / "b.jsonl")
    await store.put(keys.app("mine"), App(name="mine"))
    before = await records(store)
    with pytest.raises(BackupError, match="not empty"):
        await restore(base(store), tmp_path / "b.jsonl")
    assert await records(store) == before


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda lines: lines[:-1], "cut short"),
        (lambda lines: ["{}", *lines[1:]], "not a wakeful backup"),
        (lambda lines: [*lines[:-1], "{not json"], "not a record"),
        (lambda lines: [lines[0].replace('"schema": 1', '"schema": 99'), *lines[1:]], "schema 99"),
    ],
    ids=["truncated", "no-header", "bad-record", "newer-schema"],
)
async def test_a_damaged_or_newer_backup_is_refused_before_anything_is_written(
    store: Store, tmp_path: Path, damage: object, reason: str
) -> None:
    async with open_store("memory://") as source:
        await fill(source)
        await backup(base(source), tmp_path / "b.jsonl")
    lines = (tmp_path / "b.jsonl").read_text().splitlines()
    assert callable(damage)
    (tmp_path / "bad.jsonl").write_text("\n".join(damage(lines)) + "\n")
    with pytest.raises(BackupError, match=reason):
        await restore(base(store), tmp_path / "bad.jsonl")
    assert await records(store) == {}


async def test_a_restore_that_stopped_half_way_is_refused_by_the_control_plane_and_redone(
    store: Store, tmp_path: Path
) -> None:
    async with open_store("memory://") as source:
        await fill(source, apps=2 * BATCH)
        await backup(base(source), tmp_path / "good.jsonl")
    lines = (tmp_path / "good.jsonl").read_text().splitlines()
    # A file whose second batch repeats a key of the first: that batch fails half-way.
    broken = [lines[0], *lines[1 : BATCH + 1], lines[1], *lines[BATCH + 2 :]]
    (tmp_path / "broken.jsonl").write_text("\n".join(broken) + "\n")
    with pytest.raises(Conflict):
        await restore(base(store), tmp_path / "broken.jsonl")
    with pytest.raises(SchemaError, match="did not finish"):
        await check_schema(base(store))
    await restore(base(store), tmp_path / "good.jsonl")  # starts over
    assert await check_schema(base(store)) == SCHEMA_VERSION
    assert len((await store.list(keys.APPS, App)).items) == 2 * BATCH


async def test_the_schema_is_written_migrated_from_before_versions_or_refused_when_newer(
    store: Store,
) -> None:
    assert await check_schema(base(store)) == 0  # a new store: written
    found = await store.get(SCHEMA_KEY, Schema)
    assert found is not None and found.value.version == SCHEMA_VERSION

    await store.delete(SCHEMA_KEY)  # a store a wakeful from before versions wrote
    await store.put(keys.app("old"), App(name="old"))
    assert await check_schema(base(store)) == 0
    found = await store.get(SCHEMA_KEY, Schema)
    assert found is not None and found.value.version == SCHEMA_VERSION
    assert await store.get(keys.app("old"), App) is not None  # its data kept

    await store.put(SCHEMA_KEY, Schema(version=SCHEMA_VERSION + 1))
    with pytest.raises(SchemaError, match=f"schema {SCHEMA_VERSION + 1}.*newer wakeful"):
        await check_schema(base(store))
