"""An app's traffic between versions (issue 39; `deploy/traffic.py`, the flip in
`deploy/rollout.py`): a canary deploy, promote, a rollback during a split, `wakeful traffic`,
tags. What each test holds: every version the app routes has a pool that is not retired, a
version that leaves the route has its pool retired in the same write, and a refused change
writes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.store import routable
from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.errors import DeployError
from wakeful.deploy.rollout import Phase
from wakeful.deploy.service import Deployer
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Pool
from wakeful.store import Store, open_store

pytestmark = pytest.mark.anyio


def spec(n: int, *, state: bool = False) -> AppSpec:
    if state:  # one sandbox at a time
        return AppSpec.model_validate(
            {
                "command": ["serve", f"--v{n}"],
                "state": {"path": "data"},
                "concurrency": {"max_instances": 1},
            }
        )
    return AppSpec(command=["serve", f"--v{n}"])


def deployer(store: Store) -> Deployer:
    return Deployer(store, LocalArtifacts(Path("/nonexistent")), clock=time.time, timeout=5)


async def deployed(
    store: Store, n: int, *, canary: int = 0, state: bool = False, keep_split: bool = False
) -> Phase:
    """Deploy `web` v`n` and carry its rollout to its end, one sandbox of it serving."""
    definition = AppDefinition(name="web", spec=spec(n, state=state))
    d = deployer(store)
    rollout = await d.prepare(definition, None, canary=canary, keep_split=keep_split)
    await routable(store, f"sb-{n}", rollout.pool)
    return (await d.roll_out(rollout)).phase


async def app(store: Store) -> App:
    found = await store.get(keys.app("web"), App)
    assert found is not None
    return found.value


async def serving(store: Store) -> dict[str, bool]:
    """Version → whether its pool takes traffic (not retired)."""
    pools = (await store.list(keys.POOLS, Pool)).items
    return {p.value.version: not p.value.retired for p in pools}


async def test_a_canary_takes_its_share_beside_the_active_version_then_is_promoted() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        assert await deployed(store, 2, canary=10) is Phase.LIVE
        web = await app(store)
        assert (web.active_version, web.split) == ("v1", {"v1": 90, "v2": 10})
        assert await serving(store) == {"v1": True, "v2": True}
        promoted = await deployer(store).traffic.promote("web")
        assert (promoted.active_version, promoted.previous_version) == ("v2", "v1")
        assert promoted.split == {} and await app(store) == promoted
        assert await serving(store) == {"v1": False, "v2": True}


async def test_a_rollback_during_a_split_sends_everything_back_to_the_stable_version() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2, canary=25)
        back = await deployer(store).rollback("web")
        assert back.phase is Phase.LIVE and "back to v1" in back.message
        web = await app(store)
        assert (web.active_version, web.split) == ("v1", {})
        assert await serving(store) == {"v1": True, "v2": False}


async def test_a_plain_deploy_during_a_split_takes_all_traffic_and_ends_the_split() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2, canary=10)
        await deployed(store, 3)
        web = await app(store)
        assert (web.active_version, web.previous_version, web.split) == ("v3", "v1", {})
        assert await serving(store) == {"v1": False, "v2": False, "v3": True}


async def test_a_split_brings_back_a_retired_version_and_retires_one_it_leaves_out() -> None:
    async with open_store("memory://") as store:
        for n in (1, 2, 3):
            await deployed(store, n)
        assert await serving(store) == {"v1": False, "v2": False, "v3": True}
        await store.delete(keys.pool("web-v1"))  # swept long ago: made again from v1
        traffic = deployer(store).traffic
        web = await traffic.split("web", ["v1=50", "v2=50"])
        # v3 has no share: the largest share is active now (the first given on a tie).
        assert (web.active_version, web.split) == ("v1", {"v1": 50, "v2": 50})
        assert await serving(store) == {"v1": True, "v2": True, "v3": False}
        web = await traffic.split("web", ["latest=100"])
        assert (web.active_version, web.previous_version, web.split) == ("v3", "v1", {})
        assert await serving(store) == {"v1": False, "v2": False, "v3": True}


async def test_a_tag_keeps_its_version_serving_through_deploys_until_untagged() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2)
        traffic = deployer(store).traffic
        web = await traffic.tag("web", "old", "v1")
        assert web.tags == {"old": "v1"} and web.split == {}
        assert await serving(store) == {"v1": True, "v2": True}
        await deployed(store, 3)
        assert (await app(store)).tags == {"old": "v1"}
        assert await serving(store) == {"v1": True, "v2": False, "v3": True}
        await traffic.tag("web", "beta", "latest")
        web = await traffic.untag("web", "old")
        assert web.tags == {"beta": "v3"}
        assert await serving(store) == {"v1": False, "v2": False, "v3": True}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        pytest.param(("split", ["v1=90", "v9=10"]), "v9 is not a deployed version", id="unknown"),
        pytest.param(("split", ["v1=90", "v2=20"]), "add up to 110", id="not 100"),
        pytest.param(("tag", "a--b", "v1"), "holds '--'", id="a tag with --"),
        pytest.param(("tag", "beta", "v7"), "'v7': not a deployed version", id="tag unknown"),
        pytest.param(("untag", "nope"), "no tag 'nope'", id="untag unknown"),
        pytest.param(("promote",), "has no split", id="promote with no split"),
        pytest.param(("split", ["v1=²", "v2=100"]), "whole number", id="a digit not ASCII"),
        pytest.param(("split", ["v1=\uff150", "v2=50"]), "whole number", id="a wide digit"),
        pytest.param(("tag", "t" * 60, "v1"), "longer than a DNS label", id="a long tag host"),
    ],
)
async def test_a_refused_change_names_why_and_writes_nothing(
    change: tuple[object, ...], said: str
) -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2)
        before = await store.get(keys.app("web"), App)
        pools = await store.list(keys.POOLS, Pool)
        traffic = deployer(store).traffic
        name, *arguments = change
        with pytest.raises(DeployError, match=said):
            await getattr(traffic, str(name))("web", *arguments)
        assert await store.get(keys.app("web"), App) == before
        assert await store.list(keys.POOLS, Pool) == pools


async def test_a_stateful_app_is_never_split_nor_tagged_to_a_second_version() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1, state=True)
        await deployed(store, 2, state=True)
        d = deployer(store)
        with pytest.raises(DeployError, match="stateful"):
            await d.traffic.split("web", ["v1=50", "v2=50"])
        with pytest.raises(DeployError, match="stateful"):
            await d.traffic.tag("web", "old", "v1")
        definition = AppDefinition(name="web", spec=spec(3, state=True))
        with pytest.raises(DeployError, match="stateful"):
            await d.prepare(definition, None, canary=10)
        assert (await d.traffic.split("web", ["v1=100"])).active_version == "v1"  # one writer


async def test_a_change_waits_for_a_rollout_under_way() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        d = deployer(store)
        await d.prepare(AppDefinition(name="web", spec=spec(2)), None)  # rolling
        with pytest.raises(DeployError, match="v2 is rolling out"):
            await d.traffic.split("web", ["v1=50", "v2=50"])


async def test_a_deploy_that_keeps_the_split_joins_it_at_0_percent() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2, keep_split=True)  # no split: the active version keeps 100%
        web = await app(store)
        assert (web.active_version, web.split) == ("v1", {"v1": 100, "v2": 0})
        await deployed(store, 3, canary=10)
        await deployed(store, 4, keep_split=True)
        web = await app(store)
        assert (web.active_version, web.split) == ("v1", {"v1": 90, "v3": 10, "v4": 0})
        assert await serving(store) == {"v1": True, "v2": False, "v3": True, "v4": True}
        # Promote takes the newest version with a share (the canary), not one at 0% ...
        promoted = await deployer(store).traffic.promote("web")
        assert (promoted.active_version, promoted.split) == ("v3", {})
        await deployed(store, 5, keep_split=True)
        # ... and the newest at 0% when no other has one (a kept split's new version).
        assert (await deployer(store).traffic.promote("web")).active_version == "v5"
        with pytest.raises(DeployError, match="give no --canary or --ramp"):
            await deployer(store).prepare(
                AppDefinition(name="web", spec=spec(6)), None, canary=5, keep_split=True
            )


async def test_a_33rd_tag_is_refused_and_a_tag_moves_at_32() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2)
        traffic = deployer(store).traffic
        for n in range(32):
            await traffic.tag("web", f"t{n}", "v2")
        before = await store.get(keys.app("web"), App)
        with pytest.raises(DeployError, match="32 tags"):
            await traffic.tag("web", "t32", "v2")
        assert await store.get(keys.app("web"), App) == before  # the app still reads back
        moved = await traffic.tag("web", "t0", "v1")  # an existing tag: no new one
        assert moved.tags["t0"] == "v1" and len(moved.tags) == 32


async def test_a_stateful_version_is_refused_while_the_app_has_tags() -> None:
    async with open_store("memory://") as store:
        await deployed(store, 1)
        await deployed(store, 2)
        await deployer(store).traffic.tag("web", "old", "v1")
        with pytest.raises(DeployError, match="untag every version"):
            await deployed(store, 3, state=True)
