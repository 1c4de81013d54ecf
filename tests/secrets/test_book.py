"""The secret book (wakeful/secrets/book.py), a contract on memory, SQLite and etcd: a change
is whole or nothing, each raises the generation (and the restart generation unless told not
to); a listing holds no value; a node gets an app's values only for a sandbox recorded on it,
starting, placed there by the control plane and not behind the app's restart generation (a
record a node forged gets nothing); a rotation seals everything again with the generations as
they were."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from tests.support.placing import placement, put_placed
from wakeful.domain import keys
from wakeful.domain.models import (
    App,
    AppSecrets,
    AppSpec,
    RolloutRecord,
    Sandbox,
    SandboxStatus,
    SecretsKey,
    Version,
)
from wakeful.secrets.book import SecretBook, SecretEnv
from wakeful.secrets.errors import ChangeRefused, NotYours, UnknownSandbox
from wakeful.secrets.keys import KeyRing
from wakeful.store import Store

pytestmark = pytest.mark.anyio
PASSWORD = "correct-horse-battery-staple"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def book_on(
    store: Store, directory: Path, clock: Callable[[], float] | None = None
) -> SecretBook:
    ring = KeyRing(store, directory)
    await ring.start()
    return SecretBook(store, ring, clock=clock or Clock())


async def an_app(store: Store, name: str = "web", env: dict[str, str] | None = None) -> None:
    spec = AppSpec(command=["serve"], env=env or {"LOG_LEVEL": "info"})
    await store.put(keys.app(name), App(name=name, active_version="v1"))
    await store.put(keys.version(name, "v1"), Version(app=name, version="v1", spec=spec))


async def record(store: Store, app: str = "web") -> AppSecrets | None:
    found = await store.get(keys.secrets(app), AppSecrets)
    return None if found is None else found.value


async def test_set_seals_each_value_and_a_listing_shows_names_never_values(
    store: Store, tmp_path: Path
) -> None:
    clock = Clock()
    book = await book_on(store, tmp_path / "keys", clock)
    await an_app(store)
    changed = await book.set("web", {"DB_PASSWORD": PASSWORD, "API_KEY": "k1"}, by="ci")
    assert (changed.set, changed.generation, changed.restart_generation) == (
        ["API_KEY", "DB_PASSWORD"],
        1,
        1,
    )
    kept = await record(store)
    assert kept is not None
    assert PASSWORD not in kept.model_dump_json()
    listed = await book.listing("web")
    key = await book.ring.current()
    assert [(e.name, e.set_at, e.set_by, e.key_id) for e in listed.secrets] == [
        ("API_KEY", 1000.0, "ci", key.value.key),
        ("DB_PASSWORD", 1000.0, "ci", key.value.key),
    ]
    assert PASSWORD not in repr(listed)


async def test_each_change_raises_the_generation_and_restarts_unless_told_not_to(
    store: Store, tmp_path: Path
) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await book.set("web", {"A": "1"}, by="admin")
    quiet = await book.set("web", {"A": "2"}, by="admin", restart=False)
    assert (quiet.generation, quiet.restart_generation, quiet.restart) == (2, 1, False)
    same = await book.set("web", {"A": "2"}, by="admin")
    assert (same.written, same.unchanged, same.generation) == (False, ["A"], 2)  # no write
    gone = await book.unset("web", ["A"], by="admin")
    assert (gone.unset, gone.generation, gone.restart_generation) == (["A"], 3, 2)
    kept = await record(store)
    assert kept is not None and kept.values == {} and kept.generation == 3  # never goes back


@pytest.mark.parametrize(
    ("values", "names", "kind"),
    [
        pytest.param({"GOOD": "x", "bad-name": PASSWORD}, [], "invalid", id="one bad name of two"),
        pytest.param({"GOOD": "x", "NUL": "a\0b"}, [], "invalid", id="one bad value of two"),
        pytest.param({}, ["A", "MISSING"], "unknown", id="one unknown name of two unset"),
        pytest.param({"LOG_LEVEL": "debug"}, [], "conflict", id="a name the manifest's env sets"),
    ],
)
async def test_a_refused_change_writes_nothing(
    store: Store, tmp_path: Path, values: dict[str, str], names: list[str], kind: str
) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await book.set("web", {"A": "1"}, by="admin")
    before = await store.get(keys.secrets("web"), AppSecrets)
    change = book.set("web", values, by="admin") if values else book.unset("web", names, by="a")
    with pytest.raises(ChangeRefused) as refused:
        await change
    assert refused.value.kind == kind and PASSWORD not in str(refused.value)
    after = await store.get(keys.secrets("web"), AppSecrets)
    assert after is not None and before is not None and after.revision == before.revision


async def test_a_name_a_version_rolling_out_sets_is_refused_naming_both(
    store: Store, tmp_path: Path
) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    spec = AppSpec(command=["serve"], env={"REGION": "eu"})
    await store.put(keys.version("web", "v2"), Version(app="web", version="v2", spec=spec))
    rolling = RolloutRecord(app="web", version="v2", pool="web-v2", phase="rolling")
    await store.put(keys.rollout("web", "v2"), rolling)
    with pytest.raises(ChangeRefused, match="secret REGION: the manifest of web v2 sets REGION"):
        await book.set("web", {"REGION": "us"}, by="admin")


async def test_an_unknown_app_has_no_secrets_to_set_or_list(store: Store, tmp_path: Path) -> None:
    book = await book_on(store, tmp_path / "keys")
    for attempt in (book.set("nope", {"A": "1"}, by="admin"), book.listing("nope")):
        with pytest.raises(ChangeRefused, match="no app named 'nope'") as refused:
            await attempt
        assert refused.value.kind == "unknown"
    assert await record(store, "nope") is None


async def test_concurrent_changes_of_one_app_all_land(store: Store, tmp_path: Path) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    async with anyio.create_task_group() as tasks:
        for i in range(5):
            tasks.start_soon(lambda i=i: book.set("web", {f"S{i}": str(i)}, by="admin"))
    kept = await record(store)
    assert kept is not None
    assert sorted(kept.values) == [f"S{i}" for i in range(5)]
    assert kept.generation == kept.restart_generation == 5


def sandbox(
    sandbox_id: str, node: str, status: SandboxStatus = SandboxStatus.PENDING, app: str = "web"
) -> Sandbox:
    return Sandbox(id=sandbox_id, pool=f"{app}-v1", app=app, node=node, owner=node, status=status)


async def test_a_node_gets_the_values_only_for_a_sandbox_it_is_starting(
    store: Store, tmp_path: Path
) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await an_app(store, "api")
    await book.set("web", {"DB_PASSWORD": PASSWORD}, by="admin")
    for sandbox_id, node, status, app in [
        ("pending-1", "n1", SandboxStatus.PENDING, "web"),
        ("booting-1", "n1", SandboxStatus.BOOTING, "web"),
        ("running-1", "n1", SandboxStatus.RUNNING, "web"),
        ("theirs-1", "n2", SandboxStatus.PENDING, "web"),
        ("api-1", "n1", SandboxStatus.PENDING, "api"),
    ]:
        await put_placed(store, book.ring, sandbox(sandbox_id, node, status, app))
    wanted = SecretEnv(1, {"DB_PASSWORD": PASSWORD})
    assert await book.env_for("n1", "pending-1") == wanted
    assert await book.env_for("n1", "booting-1") == wanted
    assert await book.for_node("n1").env_for("pending-1") == {"DB_PASSWORD": PASSWORD}
    assert await book.env_for("n1", "api-1") == SecretEnv(0, {})  # an app with none
    for node, sandbox_id in [("n1", "running-1"), ("n1", "theirs-1"), ("n2", "pending-1")]:
        with pytest.raises(NotYours) as refused:
            await book.env_for(node, sandbox_id)
        assert PASSWORD not in str(refused.value)
    with pytest.raises(UnknownSandbox):
        await book.env_for("n1", "gone-1")
    assert PASSWORD not in repr(wanted)


async def test_a_rotation_seals_everything_again_and_leaves_the_generations(
    store: Store, tmp_path: Path
) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await an_app(store, "api")
    await book.set("web", {"DB_PASSWORD": PASSWORD, "A": "a"}, by="admin")
    await book.set("api", {"B": "b"}, by="admin")
    before = await record(store)
    assert before is not None
    old = before.values["A"].key_id
    rotated = await book.rotate_key()
    assert (rotated.previous, rotated.records, rotated.values) == (old, 2, 3)
    current = await store.get(keys.SECRETS_KEY, SecretsKey)
    assert current is not None and current.value.key == rotated.key != old
    after = await record(store)
    assert after is not None
    assert {v.key_id for v in after.values.values()} == {rotated.key}
    assert (after.generation, after.restart_generation) == (before.generation, 1)
    assert after.values["A"].set_at == before.values["A"].set_at
    await put_placed(store, book.ring, sandbox("s-1", "n1"))
    assert (await book.env_for("n1", "s-1")).env == {"DB_PASSWORD": PASSWORD, "A": "a"}
    await book.ring.retire(old)  # nothing is sealed under it any more
    assert await book.ring.check() == 1


def forged(real: Sandbox, kind: str) -> Sandbox:
    """What a node holding READWRITE on `sandboxes/` (but no key) can write, from a real
    record of its own it can read."""
    return {
        "no placement": real.model_copy(update={"id": "forged-1", "placement": ""}),
        "its placement on another id": real.model_copy(update={"id": "forged-1"}),
        "its placement for another app": real.model_copy(update={"app": "web", "pool": "web-v1"}),
        "its placement on another pool": real.model_copy(update={"pool": "web-v2"}),
        "its placement at a later generation": real.model_copy(
            update={"secrets_generation": real.secrets_generation + 1}
        ),
        "a made-up placement": real.model_copy(
            update={"placement": "v1:0123456789ab:" + "A" * 43 + "="}
        ),
        "garbage": real.model_copy(update={"placement": "v1:not-a-placement"}),
    }[kind]


@pytest.mark.parametrize(
    "kind",
    [
        "no placement",
        "its placement on another id",
        "its placement for another app",
        "its placement on another pool",
        "its placement at a later generation",
        "a made-up placement",
        "garbage",
    ],
)
async def test_a_sandbox_record_a_node_forged_gets_nothing(
    store: Store, tmp_path: Path, kind: str
) -> None:
    """The reviewer's hole: n2 writes a pending record of web's on itself and asks."""
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await an_app(store, "api")
    await book.set("web", {"DB_PASSWORD": PASSWORD}, by="admin")
    real = await put_placed(store, book.ring, sandbox("api-1", "n2", app="api"))
    fake = forged(real, kind)
    await store.put(keys.sandbox(fake.id), fake)
    with pytest.raises(NotYours, match="placement does not verify") as refused:
        await book.env_for("n2", fake.id)
    assert PASSWORD not in str(refused.value)


async def test_a_placement_copied_to_another_node_or_app_gets_nothing(
    store: Store, tmp_path: Path
) -> None:
    """n1's real placement of a web sandbox, copied by n2 onto a record on itself, or onto
    one of api's: neither verifies; nor does a sandbox without secrets skip the check."""
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await an_app(store, "api")
    await book.set("web", {"DB_PASSWORD": PASSWORD}, by="admin")
    real = await put_placed(store, book.ring, sandbox("web-1", "n1"))
    assert (await book.env_for("n1", "web-1")).env == {"DB_PASSWORD": PASSWORD}
    moved = real.model_copy(update={"id": "web-2", "node": "n2", "owner": "n2"})
    await store.put(keys.sandbox("web-2"), moved)
    await store.put(keys.sandbox("web-1"), moved.model_copy(update={"id": "web-1"}))
    other = real.model_copy(update={"id": "api-9", "app": "api", "pool": "api-v1"})
    await store.put(keys.sandbox("api-9"), other)
    for node, sandbox_id in [("n2", "web-2"), ("n2", "web-1"), ("n1", "api-9")]:
        with pytest.raises(NotYours, match="placement does not verify"):
            await book.env_for(node, sandbox_id)


async def test_a_sandbox_behind_the_restart_generation_gets_nothing(
    store: Store, tmp_path: Path
) -> None:
    """A change that restarts leaves the app's sandboxes behind: being replaced, they get
    nothing new, even set back to pending by their node; a change that does not restart
    leaves them current."""
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await book.set("web", {"A": "1"}, by="admin")
    await put_placed(store, book.ring, sandbox("web-1", "n1"))
    await book.set("web", {"A": "2"}, by="admin", restart=False)
    assert await book.env_for("n1", "web-1") == SecretEnv(2, {"A": "2"})
    await book.set("web", {"A": PASSWORD}, by="admin")
    with pytest.raises(NotYours, match="secrets generation 1, behind web's 2") as refused:
        await book.env_for("n1", "web-1")
    assert PASSWORD not in str(refused.value)
    lifted = await store.get(keys.sandbox("web-1"), Sandbox)
    assert lifted is not None  # the node lifts the generation itself: the MAC binds it
    raised = lifted.value.model_copy(update={"secrets_generation": 2})
    await store.put(keys.sandbox("web-1"), raised)
    with pytest.raises(NotYours, match="placement does not verify"):
        await book.env_for("n1", "web-1")
    await store.put(keys.sandbox("web-1"), placement(book.ring, raised))
    assert (await book.env_for("n1", "web-1")).env == {"A": PASSWORD}


async def test_a_placement_under_an_older_key_verifies_while_the_key_is_here(
    store: Store, tmp_path: Path
) -> None:
    book = await book_on(store, tmp_path / "keys")
    await an_app(store)
    await book.set("web", {"A": PASSWORD}, by="admin")
    await put_placed(store, book.ring, sandbox("web-1", "n1"))
    rotated = await book.rotate_key()
    assert (await book.env_for("n1", "web-1")).env == {"A": PASSWORD}
    await put_placed(store, book.ring, sandbox("web-2", "n1"))
    placed = await store.get(keys.sandbox("web-2"), Sandbox)
    assert placed is not None and placed.value.placement.startswith(f"v1:{rotated.key}:")
    assert (await book.env_for("n1", "web-2")).env == {"A": PASSWORD}
