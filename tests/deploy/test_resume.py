"""Rollouts outlive the control plane that began them (issue 13): each is recorded in the
store (`rollouts/{app}/{version}`) as it begins and as it ends, and the next leader's
`Deployer.resume` carries on those left under way, within the deadline from when they began."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from tests.support.store import routable
from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.rollout import Phase
from wakeful.deploy.service import Deployer
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Pool, RolloutRecord
from wakeful.store import Store, open_store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio
V1 = AppSpec(command=["serve"])
V2 = AppSpec(command=["serve", "--v2"])


async def serving_v1(store: Store, clock: ManualClock | None = None) -> None:
    """`web` at v1, one sandbox serving it (deployed at `clock`'s time)."""
    deployer = Deployer(store, LocalArtifacts(Path("/nonexistent")), clock=clock or time.time)
    rollout = await deployer.prepare(AppDefinition(name="web", spec=V1), None)
    assert (await deployer.roll_out(rollout)).phase is Phase.LIVE  # nothing to wait for
    await routable(store, "sb-1", rollout.pool)


async def test_a_rollout_left_under_way_is_carried_on_by_the_next_leader(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        await serving_v1(store)
        first = Deployer(store, LocalArtifacts(tmp_path))
        begun = await first.prepare(AppDefinition(name="web", spec=V2), None)
        assert begun.phase is Phase.ROLLING and begun.target_ready == 1
        # ... and the leader that began it dies before it flips.
        heir = Deployer(store, LocalArtifacts(tmp_path))
        [resumed] = await heir.resume()
        assert (resumed.app, resumed.version, resumed.target_ready) == ("web", "v2", 1)
        assert await heir.resume() == []  # carried on once
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(heir.roll_out, resumed)
            await anyio.sleep(0.3)
            assert resumed.phase is Phase.ROLLING  # waiting for v2 to be ready
            await routable(store, "sb-2", resumed.pool)
        assert resumed.phase is Phase.LIVE
        app = await store.get(keys.app("web"), App)
        assert app is not None and app.value.active_version == "v2"
        record = await store.get(keys.rollout("web", "v2"), RolloutRecord)
        assert record is not None and record.value.phase == "live"
        # Any later control plane reads how it ended.
        report = await Deployer(store, LocalArtifacts(tmp_path)).progress("web", "v2")
        assert report is not None and report.phase is Phase.LIVE


async def test_a_resumed_rollout_keeps_the_deadline_it_began_with(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000.0)
    async with open_store("memory://") as store:
        await serving_v1(store, clock)
        first = Deployer(store, LocalArtifacts(tmp_path), timeout=300, clock=clock)
        await first.prepare(AppDefinition(name="web", spec=V2), None)
        clock.advance(301)  # the takeover came after its deadline
        heir = Deployer(store, LocalArtifacts(tmp_path), timeout=300, clock=clock)
        [resumed] = await heir.resume()
        with anyio.fail_after(10):
            ended = await heir.roll_out(resumed)
        assert ended.phase is Phase.FAILED and "not ready within" in ended.message
        pool = await store.get(keys.pool(ended.pool), Pool)
        assert pool is not None and pool.value.retired  # v1 keeps serving
        record = await store.get(keys.rollout("web", "v2"), RolloutRecord)
        assert record is not None and record.value.phase == "failed"


async def test_deleting_an_app_removes_its_rollout_records(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        await serving_v1(store)
        deployer = Deployer(store, LocalArtifacts(tmp_path))
        await deployer.prepare(AppDefinition(name="web", spec=V2), None)
        await deployer.delete("web")
        assert (await store.list(keys.ROLLOUTS, RolloutRecord)).items == []
        assert await Deployer(store, LocalArtifacts(tmp_path)).resume() == []


async def test_a_rolling_record_left_after_its_flip_or_replaced_is_not_carried_on(
    tmp_path: Path,
) -> None:
    """A record still `rolling` whose flip happened (its end never written), or whose app a
    later deploy took elsewhere, must not be flipped again by the next leader: the route
    would go back."""
    clock = ManualClock(1_000_000.0)
    async with open_store("memory://") as store:
        deployer = Deployer(store, LocalArtifacts(tmp_path), clock=clock)
        v1 = await deployer.prepare(AppDefinition(name="web", spec=V1), None)
        stale = v1.record()  # as it was before its flip
        await deployer.roll_out(v1)
        clock.advance(10)
        v2 = await deployer.prepare(AppDefinition(name="web", spec=V2), None)
        await deployer.roll_out(v2)  # nothing served v1 yet: v2 flips at once
        # v1's record says `rolling` again (a leader died between its flip and its record).
        await store.put(keys.rollout("web", "v1"), stale)
        heir = Deployer(store, LocalArtifacts(tmp_path), clock=clock)
        assert await heir.resume() == []
        app = await store.get(keys.app("web"), App)
        assert app is not None and app.value.active_version == "v2"
        record = await store.get(keys.rollout("web", "v1"), RolloutRecord)
        assert record is not None and record.value.phase == "failed"


async def test_the_end_of_a_rollout_is_written_with_its_flip(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        deployer = Deployer(store, LocalArtifacts(tmp_path))
        rollout = await deployer.prepare(AppDefinition(name="web", spec=V1), None)
        await deployer.runner.carry(rollout)  # the flip alone, not the write after it
        record = await store.get(keys.rollout("web", rollout.version), RolloutRecord)
        assert record is not None and record.value.phase == "live"
