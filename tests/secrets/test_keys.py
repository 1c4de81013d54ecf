"""The key directory (wakeful/secrets/keys.py): made private, one 32-byte 0600 file per key,
the current key's id in the store; a directory or key others may read, or a key of the wrong
size, is refused with one line; a key another activator made is found when first asked for;
a key the store needs and the directory lacks stops the control plane, naming both; a sandbox's
placement verifies only over the fields it was made for, under a key here; a write etcd
retried after it committed keeps its key; rotate and retire take turns."""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from wakeful.domain import keys
from wakeful.domain.models import (
    KEY_ID_PATTERN,
    AppSecrets,
    Leader,
    Sandbox,
    SandboxStatus,
    SealedValue,
    SecretsKey,
)
from wakeful.secrets.errors import KeyRefused, KeysUnusable, MissingKey, NoSuchKey
from wakeful.secrets.keys import KeyRing
from wakeful.store import AlreadyExists, Conflict, Store, open_store

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


async def test_a_missing_current_key_with_nothing_sealed_is_replaced_at_the_start(
    memory: Store, tmp_path: Path
) -> None:
    """A store restored into a new data directory from a backup with no secrets in it: its
    current key is elsewhere, and nothing needs it, so a key made here takes its place."""
    lost = await KeyRing(memory, tmp_path / "elsewhere").start()
    ring = KeyRing(memory, tmp_path / "here")
    made = await ring.start()
    assert made != lost and ring.ids() == [made]
    found = await memory.get(keys.SECRETS_KEY, SecretsKey)
    assert found is not None and found.value.key == made


async def test_an_activator_not_leading_leaves_the_leaders_key_current(
    memory: Store, tmp_path: Path
) -> None:
    """A second activator started with a key directory of its own, before any value is
    sealed: it replaced the current key, and the leader could seal nothing more (the second
    walkthrough). While another leads, it is refused instead, and the key stays."""
    theirs = await KeyRing(memory, tmp_path / "leader").start()
    await memory.put(keys.leader("activator"), Leader(holder="a1", url="http://a1"))
    with pytest.raises(MissingKey, match=f"secrets key {theirs} is not in "):
        await KeyRing(memory, tmp_path / "second").start(leading=False)
    found = await memory.get(keys.SECRETS_KEY, SecretsKey)
    assert found is not None and found.value.key == theirs


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


def placed(ring: KeyRing, status: SandboxStatus = SandboxStatus.PENDING) -> Sandbox:
    sandbox = Sandbox(
        id="web-v1-0a1b", pool="web-v1", app="web", node="n1", secrets_generation=3, status=status
    )
    return sandbox.model_copy(
        update={"placement": ring.place("web-v1-0a1b", "web", "web-v1", "n1", 3)}
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("id", "web-v1-ffff", id="another sandbox id"),
        pytest.param("app", "api", id="another app"),
        pytest.param("pool", "web-v2", id="another pool"),
        pytest.param("node", "n2", id="another node"),
        pytest.param("node", None, id="no node"),
        pytest.param("secrets_generation", 4, id="a later generation"),
        pytest.param("secrets_generation", 2, id="an earlier generation"),
        pytest.param("placement", "", id="no placement"),
    ],
)
async def test_a_placement_verifies_only_over_the_fields_it_was_made_for(
    memory: Store, tmp_path: Path, field: str, value: object
) -> None:
    ring = KeyRing(memory, tmp_path / "keys")
    await ring.start()
    sandbox = placed(ring)
    assert ring.placed(sandbox)
    assert not ring.placed(sandbox.model_copy(update={field: value}))


async def test_a_placement_under_another_key_or_a_retired_one_does_not_verify(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    ring = KeyRing(memory, directory)
    first = await ring.start()
    sandbox = placed(ring)
    _, mac = sandbox.placement.rsplit(":", 1)
    second, _ = await ring.rotate()
    assert ring.placed(sandbox)  # an older key verifies while it is here
    assert placed(ring).placement.startswith(f"v1:{second}:")
    renamed = sandbox.model_copy(update={"placement": f"v1:{second}:{mac}"})
    assert not ring.placed(renamed)  # the same MAC named under another key
    unknown = sandbox.model_copy(update={"placement": f"v1:0123456789ab:{mac}"})
    assert not ring.placed(unknown)  # a key id not here
    other = tmp_path / "other-keys"
    assert not KeyRing(memory, other).placed(sandbox)  # a directory without the key
    other.mkdir(mode=0o700)
    (other / f"{first}.key").write_bytes(os.urandom(32))
    (other / f"{first}.key").chmod(0o600)
    assert not KeyRing(memory, other).placed(sandbox)  # another key of the same id
    await ring.retire(first)
    assert not ring.placed(sandbox)
    assert not KeyRing(memory, directory).placed(sandbox)


async def test_retire_refuses_a_key_a_starting_sandboxs_placement_names(
    memory: Store, tmp_path: Path
) -> None:
    ring = KeyRing(memory, tmp_path / "keys")
    first = await ring.start()
    for i, status in enumerate([SandboxStatus.PENDING, SandboxStatus.BOOTING]):
        sandbox = placed(ring, status).model_copy(update={"id": f"web-v1-{i}"})
        await memory.put(keys.sandbox(sandbox.id), sandbox)
    running = placed(ring, SandboxStatus.RUNNING).model_copy(update={"id": "web-v1-r"})
    await memory.put(keys.sandbox(running.id), running)  # never checked again: no hold
    await ring.rotate()
    with pytest.raises(
        KeyRefused, match=f"2 starting sandbox[(]es[)] were placed under key {first}"
    ):
        await ring.retire(first)
    for i in range(2):
        await memory.delete(keys.sandbox(f"web-v1-{i}"))
    await ring.retire(first)


async def test_retire_refuses_a_key_made_after_the_current_one_became_current(
    memory: Store, tmp_path: Path
) -> None:
    """A key file newer than the current key's record is one a rotation may be about to
    make current."""
    directory = tmp_path / "keys"
    ring = KeyRing(memory, directory)
    current = await ring.start()
    path = directory / "0123456789ab.key"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    since = (await ring.current()).value.since
    # the kernel's coarse file clock can stamp a file written after `since` a tick before it
    os.utime(path, (since - 0.005, since - 0.005))
    with pytest.raises(KeyRefused, match=f"made after the current key {current} became current"):
        await ring.retire("0123456789ab")
    os.utime(path, (since - 60, since - 60))
    await ring.retire("0123456789ab")
    assert not path.exists()


async def test_a_retire_waits_for_a_rotation_under_way_and_never_takes_its_key(
    memory: Store, tmp_path: Path
) -> None:
    """Without the one lock, a retire between the rotation's new key file and its record
    would delete the key about to become current."""
    directory = tmp_path / "keys"
    slow = Held(memory)
    ring = KeyRing(slow, directory)
    first = await ring.start()
    made: list[str] = []
    async with anyio.create_task_group() as tasks:
        slow.hold = anyio.Event()
        tasks.start_soon(lambda: rotated(ring, made))
        await slow.reached.wait()  # the new key's file is there, not yet current
        (new,) = {p.name.removesuffix(".key") for p in directory.glob("*.key")} - {first}
        tasks.start_soon(lambda: refused(ring, new))
        await anyio.sleep(0.05)
        slow.hold.set()
    assert made == [new]
    assert (directory / f"{new}.key").exists()
    assert (await ring.current()).value.key == new


async def rotated(ring: KeyRing, made: list[str]) -> None:
    made.append((await ring.rotate())[0])


async def refused(ring: KeyRing, key_id: str) -> None:
    with pytest.raises(KeyRefused, match="is the current key"):
        await ring.retire(key_id)


class Held:
    """A store whose writes of `meta/secrets-key` wait for `hold`, once set; the rest as
    the store it wraps."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.hold: anyio.Event | None = None
        self.reached = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def update(self, key: str, value: BaseModel, expect_revision: int) -> int:
        if self.hold is not None and key == keys.SECRETS_KEY:
            self.reached.set()
            await self.hold.wait()
        return await self._inner.update(key, value, expect_revision)


class Retried:
    """A store on which the first write of `meta/secrets-key` commits and then fails as a
    write etcd's client retried after its first attempt committed (`AlreadyExists` for a
    create, `Conflict` for an update)."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.retried = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def create(self, key: str, value: BaseModel, *, lease: int | None = None) -> int:
        await self._inner.create(key, value, lease=lease)
        if key != keys.SECRETS_KEY:
            return 0
        self.retried += 1
        raise AlreadyExists(key, 0)

    async def update(self, key: str, value: BaseModel, expect_revision: int) -> int:
        await self._inner.update(key, value, expect_revision)
        self.retried += 1
        raise Conflict(key, 0, expect_revision)


async def test_a_key_write_that_committed_before_it_failed_keeps_its_key(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    retried = Retried(memory)
    ring = KeyRing(retried, directory)
    first = await ring.start()
    assert [p.name for p in directory.iterdir()] == [f"{first}.key"]
    second, previous = await ring.rotate()
    assert (previous, retried.retried) == (first, 2)
    assert (await ring.current()).value.key == second
    assert sorted(p.name for p in directory.iterdir()) == sorted([f"{first}.key", f"{second}.key"])
    assert await KeyRing(memory, directory).start() == second


async def test_a_fifo_in_a_keys_place_is_refused_not_waited_on(
    memory: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    key_id = await KeyRing(memory, directory).start()
    path = directory / f"{key_id}.key"
    path.unlink()
    os.mkfifo(path, 0o600)
    # Should the open wait for a writer (the bug), one comes after 5 s and leaves at once:
    # the open returns, the read finds nothing, and the refusal names the size instead.
    unblock = threading.Timer(5, lambda: os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK)))
    unblock.start()
    try:
        with pytest.raises(KeysUnusable, match="not a regular file"):
            await KeyRing(memory, directory).start()
    finally:
        unblock.cancel()
