"""The key directory (wakeful/secrets/keys.py): made private, one 32-byte 0600 file per key,
the current key's id in the store; a directory or key others may read, or a key of the wrong
size, is refused with one line; a key another activator made is found when first asked for;
a key the store needs and the directory lacks stops the control plane, naming both."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from wakeful.domain import keys
from wakeful.domain.models import KEY_ID_PATTERN, AppSecrets, SealedValue, SecretsKey
from wakeful.secrets.errors import KeyRefused, KeysUnusable, MissingKey, NoSuchKey
from wakeful.secrets.keys import KeyRing
from wakeful.store import Store, open_store

pytestmark = pytest.mark.anyio


@pytest.fixture
async def memory() -> AsyncIterator[Store]:
    async with open_store("memory://") as store:
        yield store


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def put_sealed(store: Store, ring: KeyRing, key_id: str, app: str = "web") -> None:
    value = SealedValue(sealed=ring.seal(key_id, app, "A", "v"), set_at=1.0, set_by="admin")
    record = AppSecrets(app=app, values={"A": value}, generation=1)
    await store.put(keys.secrets(app), record)


async def test_the_first_start_makes_a_private_directory_and_one_key(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "data" / "secret-keys"
    ring = KeyRing(memory, directory)
    key_id = await ring.start()
    assert re.fullmatch(KEY_ID_PATTERN, key_id)
    assert mode(directory) == 0o700
    (made,) = directory.iterdir()
    assert made.name == f"{key_id}.key"
    assert mode(made) == 0o600 and made.stat().st_size == 32
    found = await memory.get(keys.SECRETS_KEY, SecretsKey)
    assert found is not None and found.value.key == key_id
    assert await KeyRing(memory, directory).start() == key_id  # a restart keeps it
    assert len(list(directory.iterdir())) == 1


async def test_activators_starting_at_once_on_one_directory_agree_on_one_key(
    store: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "secret-keys"
    started: list[str] = []

    async def start() -> None:
        started.append(await KeyRing(store, directory).start())

    async with anyio.create_task_group() as tasks:
        for _ in range(4):
            tasks.start_soon(start)
    assert len(set(started)) == 1
    assert [p.name for p in directory.iterdir()] == [f"{started[0]}.key"]  # losers' removed


@pytest.mark.parametrize("opened", [0o750, 0o705, 0o755], ids=oct)
async def test_a_directory_others_may_read_is_refused_in_one_line(
    memory: Store, tmp_path: Path, opened: int
) -> None:
    directory = tmp_path / "keys"
    directory.mkdir()
    directory.chmod(opened)
    with pytest.raises(KeysUnusable) as refused:
        await KeyRing(memory, directory).start()
    said = str(refused.value)
    assert str(directory) in said and "chmod 700" in said and "\n" not in said
    assert await memory.get(keys.SECRETS_KEY, SecretsKey) is None  # nothing written


async def test_a_key_file_others_may_read_or_of_the_wrong_size_is_refused(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    key_id = await KeyRing(memory, directory).start()
    path = directory / f"{key_id}.key"
    path.chmod(0o640)
    with pytest.raises(KeysUnusable, match=rf"{path}: the secrets key is open .*chmod 600"):
        await KeyRing(memory, directory).start()
    path.chmod(0o600)
    path.write_bytes(b"k" * 31)
    with pytest.raises(KeysUnusable, match=rf"{path}: not a secrets key: .*32 bytes, not 31"):
        await KeyRing(memory, directory).start()


async def test_a_key_another_activator_made_is_read_when_first_asked_for(
    memory: Store, tmp_path: Path
) -> None:
    """A standby that started before the leader rotated opens what the leader sealed."""
    directory = tmp_path / "keys"
    leader, standby = KeyRing(memory, directory), KeyRing(memory, directory)
    await leader.start()
    await standby.start()
    new, _ = await leader.rotate()
    await put_sealed(memory, leader, new)
    record = await memory.get(keys.secrets("web"), AppSecrets)
    assert record is not None
    assert standby.open("web", "A", record.value.values["A"].sealed) == "v"
    assert await standby.check() == 1


async def test_a_missing_key_stops_the_start_naming_the_key_and_the_directory(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    ring = KeyRing(memory, directory)
    first = await ring.start()
    await put_sealed(memory, ring, first)
    second, _ = await ring.rotate()  # current now, nothing sealed under it
    (directory / f"{first}.key").unlink()
    with pytest.raises(MissingKey) as refused:
        await KeyRing(memory, directory).start()
    said = str(refused.value)
    assert refused.value.key_id == first and first in said and str(directory) in said
    assert "web's secret A is sealed under it" in said and "\n" not in said
    (directory / f"{second}.key").unlink()
    with pytest.raises(MissingKey, match=f"secrets key {second} is not in {directory}"):
        await KeyRing(memory, directory).check()  # the current key is checked first


async def test_another_key_under_the_same_id_does_not_open_and_is_refused(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    ring = KeyRing(memory, directory)
    key_id = await ring.start()
    await put_sealed(memory, ring, key_id)
    path = directory / f"{key_id}.key"
    path.write_bytes(os.urandom(32))
    with pytest.raises(KeysUnusable, match=f"does not open under key {key_id}"):
        await KeyRing(memory, directory).start()


async def test_retire_refuses_the_current_key_one_in_use_and_one_not_there(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    ring = KeyRing(memory, directory)
    first = await ring.start()
    with pytest.raises(KeyRefused, match=f"key {first} is the current key"):
        await ring.retire(first)
    await put_sealed(memory, ring, first, app="web")
    await put_sealed(memory, ring, first, app="api")
    second, previous = await ring.rotate()
    assert previous == first
    with pytest.raises(KeyRefused, match=f"of api, web are still sealed under key {first}"):
        await ring.retire(first)
    with pytest.raises(NoSuchKey):
        await ring.retire("0123456789ab")
    for app in ("web", "api"):
        await put_sealed(memory, ring, second, app=app)
    await ring.retire(first)
    assert [p.name for p in directory.iterdir()] == [f"{second}.key"]
