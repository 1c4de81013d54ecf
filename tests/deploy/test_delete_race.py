"""An app deleted while a new version rolls out stays deleted: the route flip checks, in its
own transaction, that the version it points at still exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.rollout import Phase
from wakeful.deploy.service import Deployer
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Pool, Version
from wakeful.store import open_store

pytestmark = pytest.mark.anyio


async def test_a_rollout_after_its_app_was_deleted_fails_and_leaves_it_deleted(
    tmp_path: Path,
) -> None:
    spec = AppSpec(command=["serve"])
    async with open_store("memory://") as store:
        await store.put(keys.app("web"), App(name="web", active_version="v1"))
        await store.put(keys.version("web", "v1"), Version(app="web", version="v1", spec=spec))
        await store.put(
            keys.pool("web-v1"), Pool(name="web-v1", app="web", version="v1", spec=spec)
        )
        deployer = Deployer(store, LocalArtifacts(tmp_path / "artifacts"))
        changed = AppSpec(command=["serve", "--v2"])
        rollout = await deployer.prepare(AppDefinition(name="web", spec=changed), None)
        assert rollout.phase is Phase.ROLLING
        await deployer.delete("web")
        finished = await deployer.roll_out(rollout)
        assert finished.phase is Phase.FAILED
        assert "deleted" in finished.message
        assert await store.get(keys.app("web"), App) is None
