"""A stateful app's state on a node (wakeful.node.state.hold) and its adoption by the pool
controller, on every store backend, with the control plane's real blob store."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from wakeful.aio.packing import pack, unpack
from wakeful.controller.mirror import Mirror
from wakeful.controller.reconciler import Reconciler
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.artifacts import digest_of
from wakeful.domain.models import AppSpec, AppState, Node, Pool, Sandbox, SandboxStatus
from wakeful.node.state.hold import StateHold, StateRefused
from wakeful.node.state.tree import mark_restored
from wakeful.store import Store

STATEFUL = AppSpec(command=["serve"], state={"path": "data"}, concurrency={"max_instances": 1})


def state_dir(root: Path, notes: str) -> Path:
    """An ended sandbox's app tree under `root`, its state directory `data` holding `notes`."""
    data = root / "app" / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "notes.txt").write_text(notes)
    return root / "app"


def hold(store: Store, blobs: LocalArtifacts, tmp_path: Path, node: str = "n1") -> StateHold:
    """A node's hold on its states, handing them back to the control plane's own keeper."""
    keeper = StateKeeper(store, blobs).for_node(node)
    return StateHold(store, blobs, keeper, node, tmp_path / node, max_bytes=1 << 20)


def blocked_blobs(tmp_path: Path) -> tuple[Path, LocalArtifacts]:
    """A blob store that cannot write (a file where its directory should be) until the file
    returned is removed."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the blob directory should be")
    return blocked, LocalArtifacts(blocked / "blobs")


async def held_by(store: Store, node: str, epoch: int, archive: str | None = None) -> None:
    await store.put(
        keys.state("notes"),
        AppState(app="notes", node=node, epoch=epoch, sandbox="s1", archive=archive),
    )


async def current(store: Store) -> AppState:
    found = await store.get(keys.state("notes"), AppState)
    assert found is not None
    return found.value


async def test_a_stopped_sandbox_s_state_is_archived_stored_and_released_with_its_digest(
    store: Store, tmp_path: Path
) -> None:
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 7)
    tree = state_dir(tmp_path / "tree", "written before scale-to-zero")
    await hold(store, blobs, tmp_path).hand_back("notes", 7, tree, "data")
    record = await current(store)
    assert (record.node, record.epoch, record.archived_epoch) == (None, 8, 7)
    assert record.archive is not None
    data = await blobs.fetch(record.archive)
    assert digest_of(data) == record.archive and record.size == len(data)
    assert list((tmp_path / "n1" / "states").iterdir()) == []  # the local copy went once stored
    # ... and it is what the next holder restores, on another node.
    record = record.model_copy(update={"node": "n2", "epoch": 9, "sandbox": "s2"})
    await store.put(keys.state("notes"), record)
    epoch, layer = await hold(store, blobs, tmp_path, "n2").claim("notes", "s2", "data")
    assert epoch == 9 and layer.data == data and layer.path == "data"


async def test_a_release_at_a_stale_epoch_writes_nothing(store: Store, tmp_path: Path) -> None:
    """The node was presumed dead: its state was taken back and adopted elsewhere (epoch 9).
    Its late release must not overwrite the new holder's record."""
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n2", 9, archive="c" * 64)
    node = hold(store, blobs, tmp_path)
    await node.hand_back("notes", 7, state_dir(tmp_path / "tree", "stale"), "data")
    record = await current(store)
    assert (record.node, record.epoch, record.archive) == ("n2", 9, "c" * 64)
    assert node.conflicts == 1
    # What this node archived may be the only copy of the app's last writes: set aside.
    assert list((tmp_path / "n1" / "states").iterdir()) == []
    assert (tmp_path / "n1" / "kept-states" / "notes.7.tar.gz").exists()


async def test_a_corrupted_archive_is_refused_not_restored(store: Store, tmp_path: Path) -> None:
    blobs = LocalArtifacts(tmp_path / "blobs")
    good = pack(state_dir(tmp_path / "tree", "the notes") / "data", skip=frozenset())
    digest = await blobs.put(good)
    stored = tmp_path / "blobs" / f"{digest}.tar.gz"
    stored.write_bytes(good[:-8] + b"corrupt!")  # flipped on disk after it was stored
    await held_by(store, "n1", 3, archive=digest)
    with pytest.raises(StateRefused, match="does not match its sha256"):
        await hold(store, blobs, tmp_path).claim("notes", "s1", "data")
    record = await current(store)
    # Handed back unchanged (its archive is still the one named), with the reason.
    assert (record.node, record.epoch, record.archive) == (None, 4, digest)
    assert "refused, not restored" in record.error


async def test_a_claim_for_another_sandbox_or_node_is_refused(store: Store, tmp_path: Path) -> None:
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 3)
    with pytest.raises(StateRefused, match="held by node n1, not for s9"):
        await hold(store, blobs, tmp_path).claim("notes", "s9", "data")
    with pytest.raises(StateRefused, match="held by node n1"):
        await hold(store, blobs, tmp_path, "n2").claim("notes", "s1", "data")
    assert (await current(store)).epoch == 3  # nothing written


async def test_state_over_the_bound_is_kept_on_its_node_with_the_reason(
    store: Store, tmp_path: Path
) -> None:
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 3)
    tree = state_dir(tmp_path / "tree", "x" * (2 << 20))
    node = hold(store, blobs, tmp_path)
    await node.hand_back("notes", 3, tree, "data")
    record = await current(store)
    assert (record.node, record.epoch, record.kept) == ("n1", 3, True)  # never released bare
    assert "more than 1048576 bytes" in record.error
    kept = tmp_path / "n1" / "kept-states" / "notes.3" / "notes.txt"
    assert kept.read_text() == "x" * (2 << 20)
    # Kept with no archive to hand on: an operator's to act on, not released by `settle`.
    await node.settle(lambda: ())
    assert (await current(store)).node == "n1"


async def test_an_archive_the_blob_store_refuses_stays_here_and_is_handed_on_later(
    store: Store, tmp_path: Path
) -> None:
    blocked, blobs = blocked_blobs(tmp_path)
    await held_by(store, "n1", 3)
    node = hold(store, blobs, tmp_path)
    node.tries = 1
    await node.hand_back("notes", 3, state_dir(tmp_path / "tree", "only copy"), "data")
    record = await current(store)
    # Held here, in hand (not `kept`: no operator is needed, requests keep waiting for it).
    assert (record.node, record.kept) == ("n1", False)
    assert "could not be stored yet" in record.error
    local = tmp_path / "n1" / "states" / "notes.3.tar.gz"
    assert local.exists()
    # The blob store mends; the agent's periodic settle stores the local archive and releases.
    blocked.unlink()
    await node.settle(lambda: ())
    record = await current(store)
    assert (record.node, record.epoch, record.kept) == (None, 4, False)
    assert record.archive is not None and record.archive == digest_of(
        await blobs.fetch(record.archive)
    )
    assert not local.exists()


async def test_settle_hands_back_a_state_no_sandbox_of_this_run_uses(
    store: Store, tmp_path: Path
) -> None:
    """Adopted for a sandbox that was then stopped before it started: nothing newer than the
    archive exists here, so it is released unchanged; one a runner of this run has, or whose
    record says it is starting or running (a runner made after `settle` looked), is left."""
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 3, archive="d" * 64)
    node = hold(store, blobs, tmp_path)
    await node.settle(lambda: {"s1"})
    assert (await current(store)).node == "n1"
    sandbox = Sandbox(id="s1", pool="p", app="notes", node="n1")
    await store.put(keys.sandbox("s1"), sandbox)
    for status in (SandboxStatus.PENDING, SandboxStatus.BOOTING, SandboxStatus.RUNNING):
        await store.put(keys.sandbox("s1"), sandbox.model_copy(update={"status": status}))
        await node.settle(lambda: ())
        assert (await current(store)).node == "n1"  # started by this run (or about to be)
    await store.delete(keys.sandbox("s1"))
    await node.settle(lambda: ())
    record = await current(store)
    assert (record.node, record.epoch, record.archive) == (None, 4, "d" * 64)


async def test_of_two_adopters_exactly_one_wins(store: Store) -> None:
    """Two pool controllers (an old leader and a new one) plan the same free state at once:
    one sandbox is created, and the state names it."""
    pool = Pool(name="notes-v1", app="notes", version="v1", spec=STATEFUL, desired_instances=1)
    await store.put(keys.pool(pool.name), pool)
    for name in ("n1", "n2"):
        await store.put(keys.node(name), Node(name=name, address=name))
    await store.put(keys.state("notes"), AppState(app="notes", epoch=4, released_by="n1"))
    # Both plan from the same view, taken before either wrote: each decides to adopt at 4.
    seen = Mirror()
    for table, prefix, model in (
        (seen.pools, keys.POOLS, Pool),
        (seen.nodes, keys.NODES, Node),
        (seen.sandboxes, keys.SANDBOXES, Sandbox),
        (seen.states, keys.STATES, AppState),
    ):
        listing = await store.list(prefix, model)
        table.replace(listing.items, listing.revision)  # type: ignore[arg-type]
    seen.cordons.replace([], 0)
    seen.done_listing()
    first, second = Reconciler(store, lambda _: 0), Reconciler(store, lambda _: 0)
    await first.step(seen)
    await second.step(seen)
    sandboxes = (await store.list(keys.SANDBOXES, Sandbox)).items
    assert len(sandboxes) == 1
    record = await current(store)
    assert (record.sandbox, record.epoch) == (sandboxes[0].value.id, 5)
    assert record.node == sandboxes[0].value.node
    assert second.metrics.conflicts._value.get() == 1  # the loser wrote nothing


async def test_a_state_path_that_is_a_symbolic_link_is_never_followed(
    store: Store, tmp_path: Path
) -> None:
    """The app owns its tree: pointing its state at a host path must not make the agent (root)
    archive that path and hand it to the app on its next wake."""
    secret = tmp_path / "host-secret"
    secret.mkdir()
    (secret / "token").write_text("the node's credential")
    tree = tmp_path / "tree" / "app"
    tree.mkdir(parents=True)
    (tree / "data").symlink_to(secret)
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 3, archive="e" * 64)
    await hold(store, blobs, tmp_path).hand_back("notes", 3, tree, "data")
    record = await current(store)
    assert (record.node, record.epoch, record.archive) == (None, 4, "e" * 64)  # its last one
    assert "symbolic link" in record.error
    assert [d for d, _ in await blobs.stored()] == []  # nothing of the host's was stored
    # A linked file inside it, and anything not a regular file, are left out.
    (tree / "data").unlink()
    (tree / "data").mkdir()
    (tree / "data" / "notes.txt").write_text("mine")
    (tree / "data" / "stolen").symlink_to(secret / "token")
    os.mkfifo(tree / "data" / "pipe")  # opening it to read would block the agent for ever
    await held_by(store, "n1", 5)
    await hold(store, blobs, tmp_path).hand_back("notes", 5, tree, "data")
    archive = (await current(store)).archive
    assert archive is not None
    unpacked = tmp_path / "unpacked"
    unpack(await blobs.fetch(archive), unpacked)
    assert sorted(p.name for p in unpacked.iterdir()) == ["notes.txt"]


async def test_a_restarted_agent_salvages_what_a_killed_run_left_only_from_a_restored_tree(
    store: Store, tmp_path: Path
) -> None:
    """Killed while its sandbox ran: the next run packs the left tree before clearing it and
    hands it back with the app's latest writes. A tree whose restore never finished (no mark)
    is not packed: the state goes back unchanged, its archive still the latest."""
    blobs = LocalArtifacts(tmp_path / "blobs")
    pool = Pool(name="notes-v1", app="notes", version="v1", spec=STATEFUL, desired_instances=1)
    await store.put(keys.pool(pool.name), pool)
    # Its record may be gone already (stopped, then removed before the kill was noticed).
    await held_by(store, "n1", 3, archive="f" * 64)
    base = tmp_path / "n1" / "sandboxes" / "s1"
    state_dir(base, "the latest note")
    node = hold(store, blobs, tmp_path)
    await node.salvage((await store.list(keys.SANDBOXES, Sandbox)).items)
    await node.settle(lambda: ())
    assert (await current(store)).archive == "f" * 64  # no mark: released unchanged
    await held_by(store, "n1", 5, archive="f" * 64)
    mark_restored(base, "data")
    await node.salvage((await store.list(keys.SANDBOXES, Sandbox)).items)
    shutil.rmtree(base)  # the agent clears the previous run's directories next
    await node.settle(lambda: ())
    record = await current(store)
    assert (record.node, record.epoch) == (None, 6)
    assert record.archive is not None and record.archive != "f" * 64
    unpacked = tmp_path / "unpacked"
    unpack(await blobs.fetch(record.archive), unpacked)
    assert (unpacked / "notes.txt").read_text() == "the latest note"


async def test_an_archive_the_blob_store_refuses_for_good_is_kept_not_retried(
    store: Store, tmp_path: Path
) -> None:
    blobs = LocalArtifacts(tmp_path / "blobs", state_max_bytes=1024)
    await held_by(store, "n1", 3)
    node = hold(store, blobs, tmp_path)
    await node.hand_back("notes", 3, state_dir(tmp_path / "tree", os.urandom(4096).hex()), "data")
    record = await current(store)
    assert (record.node, record.kept) == ("n1", True)
    assert "refused" in record.error and "bound is 1024" in record.error
    assert (tmp_path / "n1" / "kept-states" / "notes.3.tar.gz").exists()
    assert not (tmp_path / "n1" / "states" / "notes.3.tar.gz").exists()  # settle leaves it
    await node.settle(lambda: ())
    assert (await current(store)).kept


async def test_a_blob_store_that_cannot_answer_is_not_a_corrupt_archive(
    store: Store, tmp_path: Path
) -> None:
    """An archive that cannot be read now (here: its file is unreadable) is tried again and
    then refused for now, the state left held (`settle` hands it back once the sandbox has
    ended); only an archive that is not there, or not what its digest says, is refused for
    good and handed back with the reason."""
    blobs = LocalArtifacts(tmp_path / "blobs")
    (tmp_path / "blobs" / f"{'a' * 64}.tar.gz").mkdir(parents=True)  # reading it fails
    await held_by(store, "n1", 3, archive="a" * 64)
    node = hold(store, blobs, tmp_path)
    node.tries = 2
    with pytest.raises(StateRefused, match="cannot be fetched now"):
        await node.claim("notes", "s1", "data")
    assert ((await current(store)).node, (await current(store)).epoch) == ("n1", 3)
    await held_by(store, "n1", 3, archive="c" * 64)
    with pytest.raises(StateRefused, match="refused, not restored: no artifact"):
        await node.claim("notes", "s1", "data")
    assert ((await current(store)).node, (await current(store)).epoch) == (None, 4)


async def test_state_too_large_to_even_copy_goes_back_at_its_last_archive(
    store: Store, tmp_path: Path
) -> None:
    """A sparse file of 1 GiB takes no room in the sandbox, but a copy would write it out
    whole on the node's disk: past 4x the bound nothing is copied, and since nothing of it
    can be kept the state goes back at its last archive, saying what was lost."""
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 3, archive="b" * 64)
    tree = state_dir(tmp_path / "tree", "small")
    with (tree / "data" / "sparse.bin").open("wb") as sparse:
        sparse.truncate(1 << 30)
    await hold(store, blobs, tmp_path).hand_back("notes", 3, tree, "data")
    record = await current(store)
    assert (record.node, record.epoch, record.archive, record.kept) == (None, 4, "b" * 64, False)
    assert "no copy of it could be kept" in record.error
    assert not (tmp_path / "n1" / "kept-states").exists()


async def test_a_file_that_cannot_be_read_is_never_a_silent_gap(
    store: Store, tmp_path: Path
) -> None:
    """A path too long to unpack again on a node (past PATH_MAX there) is refused, not left
    out of the archive in silence; such a tree cannot be copied aside either, so the state
    goes back at its last archive with the reason."""
    blobs = LocalArtifacts(tmp_path / "blobs")
    await held_by(store, "n1", 3)
    tree = state_dir(tmp_path / "tree", "top")
    deep = os.open(tree / "data", os.O_RDONLY)
    try:
        for _ in range(450):  # 450 * 10 bytes: past PATH_MAX from the node's root
            os.mkdir("d" * 9, dir_fd=deep)
            inner = os.open("d" * 9, os.O_RDONLY, dir_fd=deep)
            os.close(deep)
            deep = inner
        fd = os.open("deepfile.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=deep)
        os.write(fd, b"far down")
        os.close(fd)
    finally:
        os.close(deep)
    await hold(store, blobs, tmp_path).hand_back("notes", 3, tree, "data")
    record = await current(store)
    assert (record.node, record.epoch, record.archive) == (None, 4, None)
    assert "is a path of more than 2048 bytes" in record.error
    assert "no copy of it could be kept" in record.error
