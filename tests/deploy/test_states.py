"""A stateful app's state handed back to the control plane (`wakeful.deploy.states`, invariant
21): only the node holding it at an epoch stores its archive and releases it; what nodes stored
and have not released is bounded, per node and in all. On every store backend, then over real
HTTP with node tokens, as the outside review attacked it: a token named after no node storing
archives, a node pointing another app's state at an archive of its choosing."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.control import running_control_plane
from wakeful.aio.packing import pack
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import (
    ArchiveMissing,
    Bounds,
    NotHeld,
    StateKeeper,
    StorageFull,
    upload_refusal,
)
from wakeful.domain import keys
from wakeful.domain.artifacts import ArtifactError, digest_of
from wakeful.domain.models import AppState, Sandbox
from wakeful.domain.state import Stale
from wakeful.remote import HttpKeeper
from wakeful.store import Store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio
MIB = 1 << 20


@pytest.mark.parametrize(
    ("node", "total", "size", "refusal"),
    [
        pytest.param(0, 0, 3 * MIB, None, id="nothing pending: one archive over the bound fits"),
        pytest.param(MIB, MIB, MIB, None, id="within both bounds"),
        pytest.param(2 * MIB, 2 * MIB, MIB, "node_full", id="past the node's bound"),
        pytest.param(MIB, 4 * MIB, MIB, "total_full", id="past the total with the node within"),
        pytest.param(2 * MIB, 5 * MIB, MIB, "node_full", id="past both: the node's is named"),
        pytest.param(MIB, MIB, 2 * MIB, "node_full", id="one large archive on top of another"),
    ],
)
def test_upload_refusal(node: int, total: int, size: int, refusal: str | None) -> None:
    assert upload_refusal(node, total, size, Bounds(per_node=2 * MIB, total=4 * MIB)) == refusal


def archive(tmp_path: Path, text: str, size: int = 0) -> bytes:
    """A state archive holding `text` (and `size` random bytes: incompressible)."""
    directory = tmp_path / f"state-{text}"
    directory.mkdir()
    (directory / "notes.txt").write_text(text)
    (directory / "blob").write_bytes(os.urandom(size))
    return pack(directory, skip=frozenset())


async def held(store: Store, app: str, node: str | None, epoch: int) -> None:
    await store.put(keys.state(app), AppState(app=app, node=node, epoch=epoch, sandbox="s1"))


async def record(store: Store, app: str) -> AppState:
    found = await store.get(keys.state(app), AppState)
    assert found is not None
    return found.value


def keeper_on(
    store: Store, tmp_path: Path, clock: ManualClock, bounds: Bounds | None = None
) -> tuple[StateKeeper, LocalArtifacts, CollectorRegistry]:
    blobs = LocalArtifacts(tmp_path / "blobs", state_max_bytes=4 * MIB, clock=clock)
    registry = CollectorRegistry()
    return (
        StateKeeper(store, blobs, bounds, grace=600, registry=registry, clock=clock),
        blobs,
        (registry),
    )


def refused(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "wakeful_deploy_state_uploads_refused_total", {"reason": reason}
    )
    assert value is not None
    return value


async def test_only_the_holder_at_its_epoch_stores_and_releases(
    store: Store, tmp_path: Path
) -> None:
    keeper, blobs, registry = keeper_on(store, tmp_path, ManualClock(1000))
    await held(store, "notes", "n1", 7)
    data = archive(tmp_path, "mine")
    digest = digest_of(data)
    for node, epoch in (("n2", 7), ("n1", 6), ("nobody", 7)):
        with pytest.raises(NotHeld, match=f"node {node} does not hold the state"):
            await keeper.store_archive(node, "notes", epoch, data, digest)
    assert not blobs.has(digest)  # refused before anything was written
    assert refused(registry, "not_held") == 3
    with pytest.raises(NotHeld, match="held by nobody"):
        await keeper.store_archive("n1", "other", 7, data, digest)

    await keeper.store_archive("n1", "notes", 7, data, digest)
    assert blobs.has(digest)
    # Another node cannot release it, nor the holder at another epoch: nothing written.
    for node, epoch in (("n2", 7), ("n1", 6)):
        stale = await keeper.release(node, "notes", epoch, archive=digest, size=len(data))
        assert isinstance(stale, Stale)
        assert (await record(store, "notes")).node == "n1"
    written = await keeper.release("n1", "notes", 7, archive=digest, size=len(data))
    assert isinstance(written, AppState)
    assert (written.node, written.epoch, written.archive) == (None, 8, digest)
    assert await record(store, "notes") == written


async def test_a_release_names_only_a_stored_archive_and_a_keep_only_its_own_state(
    store: Store, tmp_path: Path
) -> None:
    keeper, _, _ = keeper_on(store, tmp_path, ManualClock(1000))
    await held(store, "notes", "n1", 7)
    with pytest.raises(ArchiveMissing, match="is not stored"):
        await keeper.release("n1", "notes", 7, archive="a" * 64, size=10)
    assert isinstance(await keeper.keep("n2", "notes", 7, "not mine"), Stale)
    kept = await keeper.keep("n1", "notes", 7, "its archive could not be stored yet")
    assert isinstance(kept, AppState) and kept.kept and kept.node == "n1"
    assert await keeper.release("n1", "gone", 1) is None  # no record: nothing to write


async def test_a_release_waits_on_the_sandbox_it_was_decided_for(
    store: Store, tmp_path: Path
) -> None:
    """`settle` hands a state back only while the sandbox it read is as it read it."""
    keeper, _, _ = keeper_on(store, tmp_path, ManualClock(1000))
    await held(store, "notes", "n1", 7)
    sandbox = Sandbox(id="s1", pool="notes-v1", app="notes", node="n1")
    revision = await store.put(keys.sandbox("s1"), sandbox)
    await store.put(keys.sandbox("s1"), sandbox.model_copy(update={"epoch": 2}))  # moved on
    assert await keeper.release("n1", "notes", 7, sandbox_at=("s1", revision)) is None
    assert (await record(store, "notes")).node == "n1"
    now = (await store.get(keys.sandbox("s1"), Sandbox)) or pytest.fail("sandbox gone")
    released = await keeper.release("n1", "notes", 7, sandbox_at=("s1", now.revision))
    assert isinstance(released, AppState) and released.node is None


async def test_what_nodes_stored_and_did_not_release_is_bounded(
    store: Store, tmp_path: Path
) -> None:
    clock = ManualClock(1000)
    bounds = Bounds(per_node=3 * MIB, total=4 * MIB + MIB // 4)
    keeper, _, registry = keeper_on(store, tmp_path, clock, bounds)
    await held(store, "a", "n1", 1)
    await held(store, "b", "n2", 1)
    first = archive(tmp_path, "1", 2 * MIB)
    await keeper.store_archive("n1", "a", 1, first, digest_of(first))
    again = archive(tmp_path, "2", 2 * MIB)  # a node storing archive after archive
    with pytest.raises(StorageFull, match="node n1 stored 2") as full:
        await keeper.store_archive("n1", "a", 1, again, digest_of(again))
    assert full.value.retry_after > 0
    other = archive(tmp_path, "3", 2 * MIB)
    await keeper.store_archive("n2", "b", 1, other, digest_of(other))
    third = archive(tmp_path, "4", MIB // 2)  # n1 within its own bound, all nodes past theirs
    with pytest.raises(StorageFull, match="all nodes stored"):
        await keeper.store_archive("n1", "a", 1, third, digest_of(third))
    assert (refused(registry, "node_full"), refused(registry, "total_full")) == (1, 1)
    pending = registry.get_sample_value("wakeful_deploy_state_pending_bytes")
    assert pending == len(first) + len(other)

    # A release takes its archive off the count; so does the collector's grace.
    await keeper.release("n1", "a", 1, archive=digest_of(first), size=len(first))
    await held(store, "a", "n1", 3)
    await keeper.store_archive("n1", "a", 3, again, digest_of(again))
    with pytest.raises(StorageFull):
        await keeper.store_archive("n1", "a", 3, first, digest_of(first))
    clock.advance(601)
    await keeper.store_archive("n1", "a", 3, first, digest_of(first))


async def test_the_review_s_attacks_over_http_store_and_point_nothing(tmp_path: Path) -> None:
    """The outside review's reproduction: a node token named after no node stored three
    8 MiB archives (201 each). And with `states/` write, a node could point another tenant's
    state at an archive of its own. Over the control API, with node tokens, both refused."""
    async with running_control_plane(tmp_path, state_max_bytes=16 * MIB) as running:
        admin = {"Authorization": f"Bearer {running.token}"}
        async with httpx.AsyncClient(base_url=running.url, headers=admin) as http:
            tokens = {}
            for name in ("ghost", "n1", "n2"):
                made = await http.post("/v1/tokens", json={"name": name, "role": "node"})
                tokens[name] = made.json()["secret"]
        store = running.store
        blobs = tmp_path / "artifacts"
        await held(store, "shop", "n1", 4)  # another tenant's app, on n1
        await held(store, "mine", "n2", 9)  # n2's own
        big = archive(tmp_path, "ghost", 8 * MIB)
        async with HttpKeeper(running.url, tokens["ghost"], "ghost") as ghost:
            for _ in range(3):
                with pytest.raises(ArtifactError, match=r"409.*ghost does not hold"):
                    await ghost.store("shop", 4, big, digest_of(big))
        assert not blobs.exists() or list(blobs.iterdir()) == []

        chosen = archive(tmp_path, "attacker's files")
        async with HttpKeeper(running.url, tokens["n2"], "n2") as n2:
            with pytest.raises(ArtifactError, match="409"):
                await n2.store("shop", 4, chosen, digest_of(chosen))
            await n2.store("mine", 9, chosen, digest_of(chosen))  # its own: stored
            stale = await n2.release("shop", 4, archive=digest_of(chosen), size=len(chosen))
            assert isinstance(stale, Stale) and "not by node n2" in stale.reason
        async with HttpKeeper(running.url, tokens["n2"], "n1") as posing:  # n2 says it is n1
            with pytest.raises(ArtifactError, match=r"403.*cannot act for node 'n1'"):
                await posing.store("shop", 4, chosen, digest_of(chosen))
            with pytest.raises(ArtifactError, match="403"):
                await posing.release("shop", 4)
        assert await record(store, "shop") == AppState(app="shop", node="n1", epoch=4, sandbox="s1")


async def test_uploads_admitted_at_once_count_before_any_is_stored(
    store: Store, tmp_path: Path
) -> None:
    """The hostile review's overshoot: four concurrent uploads all passed the bound's check
    before any was counted. An admitted upload counts as pending from its admission."""
    keeper, _, _ = keeper_on(store, tmp_path, ManualClock(1000), Bounds(3 * MIB, 8 * MIB))
    await held(store, "a", "n1", 1)
    first = await keeper.admit("n1", "a", 1, 2 * MIB)
    with pytest.raises(StorageFull, match="node n1 stored 2097152"):
        await keeper.admit("n1", "a", 1, 2 * MIB)
    keeper.cancel(first)  # that upload failed: it counts no more
    second = await keeper.admit("n1", "a", 1, 2 * MIB)
    data = archive(tmp_path, "small")
    await keeper.store_archive("n1", "a", 1, data, digest_of(data), second)
    mine, _ = keeper._pending.sizes("n1", 1000)
    assert mine == len(data)  # the ticket's 2 MiB became what was stored


async def test_storing_bytes_already_stored_does_not_keep_them_from_collection(
    store: Store, tmp_path: Path
) -> None:
    """A node can fetch any digest: uploading it again must not start its grace again, or a
    node could keep a deleted app's files for ever."""
    clock = ManualClock(1000)
    keeper, blobs, _ = keeper_on(store, tmp_path, clock)
    await held(store, "a", "n1", 1)
    data = archive(tmp_path, "someone else's")
    digest = await blobs.put(data)  # stored at 1000, by someone else
    clock.advance(500)
    await keeper.store_archive("n1", "a", 1, data, digest)
    assert dict(await blobs.stored())[digest] == 1000
