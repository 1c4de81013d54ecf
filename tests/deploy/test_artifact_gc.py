"""Artifact collection on real files and the memory store, on a clock the test drives: an
artifact no version references is deleted once its grace period has passed since it was last
uploaded or claimed by a deploy, never before, and never while a version references it."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from wakeful.aio.packing import pack
from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.collect import ArtifactCollector
from wakeful.deploy.service import Deployer
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, AppState, Version
from wakeful.store import Store, open_store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"
GRACE = 600.0
SPEC = AppSpec(command=["serve"])


def packed(tmp_path: Path, text: str) -> bytes:
    """A small app directory whose one file says `text`: a distinct artifact per text."""
    directory = tmp_path / f"app-{text}"
    directory.mkdir()
    (directory / "app.py").write_text(f"print({text!r})\n")
    return pack(directory)


async def reference(store: Store, app: str, version: str, digest: str) -> None:
    await store.put(
        keys.version(app, version), Version(app=app, version=version, spec=SPEC, artifact=digest)
    )


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with open_store("memory://") as opened:
        yield opened


async def test_only_an_unreferenced_artifact_goes_and_only_once_its_grace_has_passed(
    tmp_path: Path, store: Store
) -> None:
    clock = ManualClock()
    artifacts = LocalArtifacts(tmp_path / "artifacts", clock=clock)
    collector = ArtifactCollector(store, artifacts, grace=GRACE, clock=clock)
    used = await artifacts.put(packed(tmp_path, "used"))
    shared = await artifacts.put(packed(tmp_path, "shared"))
    orphan = await artifacts.put(packed(tmp_path, "orphan"))
    await reference(store, "web", "v1", used)
    await reference(store, "web", "v2", shared)
    await reference(store, "api", "v1", shared)

    assert await collector.collect() == []
    clock.advance(GRACE - 1)
    assert await collector.collect() == []
    assert artifacts.has(orphan)
    clock.advance(2)
    assert await collector.collect() == [orphan]
    assert not artifacts.has(orphan)

    await store.delete(keys.version("web", "v2"))  # `api` still uses it
    clock.advance(10 * GRACE)
    assert await collector.collect() == []
    assert artifacts.has(used) and artifacts.has(shared)


async def test_an_upload_whose_version_is_not_written_yet_is_kept_for_the_grace(
    tmp_path: Path, store: Store
) -> None:
    """Uploading again (the artifact was stored long ago and nobody used it since) starts the
    grace again: the deploy that follows the upload must still find it."""
    clock = ManualClock()
    artifacts = LocalArtifacts(tmp_path / "artifacts", clock=clock)
    collector = ArtifactCollector(store, artifacts, grace=GRACE, clock=clock)
    data = packed(tmp_path, "again")
    digest = await artifacts.put(data)
    clock.advance(GRACE + 1)
    assert await artifacts.put(data) == digest
    clock.advance(GRACE - 1)
    assert await collector.collect() == []
    deployer = Deployer(store, artifacts, collector=collector, clock=clock)
    await deployer.prepare(AppDefinition(name="web", spec=SPEC), digest)
    clock.advance(10 * GRACE)
    assert await collector.collect() == []
    assert artifacts.has(digest)


async def test_a_deploy_claims_its_artifact_and_refuses_a_collected_one(
    tmp_path: Path, store: Store
) -> None:
    clock = ManualClock()
    artifacts = LocalArtifacts(tmp_path / "artifacts", clock=clock)
    collector = ArtifactCollector(store, artifacts, grace=GRACE, clock=clock)
    claimed = await artifacts.put(packed(tmp_path, "claimed"))
    lost = await artifacts.put(packed(tmp_path, "lost"))
    clock.advance(GRACE + 1)
    # Between a deploy's claim and its version record, a collection leaves the artifact alone.
    assert await artifacts.keep(claimed)
    assert await collector.collect() == [lost]
    assert artifacts.has(claimed)
    deployer = Deployer(store, artifacts, collector=collector, clock=clock)
    with pytest.raises(ValueError, match=f"artifact {lost} was not uploaded"):
        await deployer.prepare(AppDefinition(name="web", spec=SPEC), lost)


async def test_deleting_an_app_collects_what_it_alone_used_once_the_grace_passed(
    tmp_path: Path, store: Store
) -> None:
    clock = ManualClock()
    artifacts = LocalArtifacts(tmp_path / "artifacts", clock=clock)
    collector = ArtifactCollector(store, artifacts, grace=GRACE, clock=clock)
    deployer = Deployer(store, artifacts, collector=collector, clock=clock)
    old = await artifacts.put(packed(tmp_path, "old"))
    await store.put(keys.app("web"), App(name="web", active_version="v1"))
    await reference(store, "web", "v1", old)
    clock.advance(GRACE + 1)
    fresh = await artifacts.put(packed(tmp_path, "fresh"))  # a redeploy on its way
    deletion = await deployer.delete("web")
    assert deletion.artifacts_removed == 1
    assert not artifacts.has(old)
    assert artifacts.has(fresh)


async def test_a_version_record_that_does_not_validate_stops_the_collection(
    tmp_path: Path, store: Store
) -> None:
    """What an unreadable version references is unknown: nothing is deleted until it reads."""
    clock = ManualClock()
    artifacts = LocalArtifacts(tmp_path / "artifacts", clock=clock)
    collector = ArtifactCollector(store, artifacts, grace=GRACE, clock=clock)
    digest = await artifacts.put(packed(tmp_path, "maybe"))
    await store.put(keys.version("web", "v1"), App(name="web"))  # not a Version
    clock.advance(GRACE + 1)
    assert await collector.collect() == []
    assert artifacts.has(digest)
    await store.delete(keys.version("web", "v1"))
    assert await collector.collect() == [digest]


async def test_stored_artifacts_are_private_and_a_crashed_upload_is_swept(
    tmp_path: Path, store: Store
) -> None:
    clock = ManualClock()
    directory = tmp_path / "artifacts"
    artifacts = LocalArtifacts(directory, clock=clock)
    digest = await artifacts.put(pack(HELLO))
    left = directory / f"{digest}.abc123.part"
    left.write_bytes(b"half an upload")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / f"{digest}.tar.gz").stat().st_mode) == 0o600
    await reference(store, "web", "v1", digest)
    assert await ArtifactCollector(store, artifacts, clock=clock).collect() == []
    assert not left.exists()
    assert [p.name for p in directory.iterdir()] == [f"{digest}.tar.gz"]


async def test_a_state_archive_is_kept_while_named_and_collected_once_superseded(
    tmp_path: Path, store: Store
) -> None:
    """A stateful app's archives live beside the artifacts; its record names the latest. A
    release that names a newer one supersedes the old, which goes after its grace period."""
    clock = ManualClock()
    artifacts = LocalArtifacts(tmp_path / "artifacts", clock=clock)
    collector = ArtifactCollector(store, artifacts, grace=GRACE, clock=clock)
    old = await artifacts.put(packed(tmp_path, "notes-1"))
    newer = packed(tmp_path, "notes-2")
    new = await artifacts.put(newer)
    await store.put(keys.state("notes"), AppState(app="notes", epoch=3, archive=old))
    clock.advance(GRACE + 1)
    assert await collector.collect() == [new]  # uploaded, never released: an orphan
    await artifacts.put(newer)  # stored again by the next hand-back, then released
    await store.put(keys.state("notes"), AppState(app="notes", epoch=4, archive=new))
    clock.advance(GRACE + 1)
    assert await collector.collect() == [old]
    assert artifacts.has(new)
