"""A progressive rollout (issue 39, `deploy/ramp.py`): from its first share to 100% in equal
steps on a clock the test moves, rolled back by itself on the verdict, ended where it is when
someone changes the split, and carried on by the next leader from its record."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.store import routable
from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.ramp import changed_by_hand
from wakeful.deploy.rollout import Phase, Rollout
from wakeful.deploy.service import Deployer
from wakeful.domain import keys
from wakeful.domain.models import App, AppSpec, Pool, RolloutRecord
from wakeful.domain.split import Window
from wakeful.store import Store, open_store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio

HEALTHY = {"v1": Window(900, 9, 0.020), "v2": Window(100, 1, 0.022)}
FAILING = {"v1": Window(900, 9, 0.020), "v2": Window(100, 30, 0.021)}
SLOW = {"v1": Window(900, 0, 0.020), "v2": Window(100, 0, 0.500)}
FEW = {"v1": Window(900, 0, 0.020), "v2": Window(10, 5, 0.020)}


class Figures:
    """What the activator's ring would say: set by the test."""

    def __init__(self) -> None:
        self.now: dict[str, Window] = HEALTHY

    def __call__(self, app: str, seconds: float) -> dict[str, Window]:
        return self.now


def deployer(store: Store, clock: ManualClock, figures: Figures) -> Deployer:
    return Deployer(
        store, LocalArtifacts(Path("/nonexistent")), clock=clock, timeout=60, windows=figures
    )


async def ramping(store: Store, d: Deployer, *, ramp: float = 40, canary: int = 0) -> Rollout:
    """`web` v1 serving, then v2 deployed with a ramp: flipped to its first share."""
    first = await d.prepare(AppDefinition(name="web", spec=AppSpec(command=["v1"])), None)
    await routable(store, "sb-1", first.pool)
    await d.roll_out(first)
    second = await d.prepare(
        AppDefinition(name="web", spec=AppSpec(command=["v2"])), None, canary=canary, ramp=ramp
    )
    await routable(store, "sb-2", second.pool)
    await d.runner.run(second)
    assert second.phase is Phase.RAMPING
    return second


async def state(store: Store) -> tuple[App, dict[str, bool], RolloutRecord]:
    app = await store.get(keys.app("web"), App)
    pools = (await store.list(keys.POOLS, Pool)).items
    record = await store.get(keys.rollout("web", "v2"), RolloutRecord)
    assert app is not None and record is not None
    return app.value, {p.value.version: not p.value.retired for p in pools}, record.value


async def test_a_healthy_ramp_moves_in_equal_steps_to_100_and_promotes() -> None:
    clock, figures = ManualClock(), Figures()
    async with open_store("memory://") as store:
        d = deployer(store, clock, figures)
        rollout = await ramping(store, d)
        app, serving, record = await state(store)
        assert app.split == {"v1": 99, "v2": 1} and app.active_version == "v1"
        assert (record.phase, record.stable, record.share) == ("ramping", "v1", 1)
        seen = []
        for _ in range(5):
            await d.ramps.step(rollout)
            seen.append((await state(store))[0].split.get("v2", 100))
            await d.ramps.step(rollout)  # not due again until the clock moves: nothing
            clock.advance(10)
        assert seen == [1, 26, 51, 75, 100]
        app, serving, record = await state(store)
        assert (app.active_version, app.previous_version, app.split) == ("v2", "v1", {})
        assert serving == {"v1": False, "v2": True}
        assert record.phase == "live" and "reached 100%" in record.message
        assert rollout.phase is Phase.LIVE


@pytest.mark.parametrize(
    ("figures", "said"),
    [(FAILING, "5xx on 30.0% of 100 requests"), (SLOW, "p99 500 ms against 20 ms")],
    ids=["errors", "p99"],
)
async def test_a_version_answering_worse_is_rolled_back_by_itself(
    figures: dict[str, Window], said: str
) -> None:
    clock, seen = ManualClock(), Figures()
    async with open_store("memory://") as store:
        d = deployer(store, clock, seen)
        rollout = await ramping(store, d, canary=10)
        clock.advance(10)
        await d.ramps.step(rollout)  # healthy: the next step
        assert (await state(store))[0].split == {"v1": 68, "v2": 32}
        seen.now = figures
        await d.ramps.step(rollout)
        app, serving, record = await state(store)
        assert (app.active_version, app.split) == ("v1", {})
        assert serving == {"v1": True, "v2": False}
        assert record.phase == "failed" and "rolled back at 32%" in record.message
        assert said in record.message and rollout.phase is Phase.FAILED
        ended = d.ramps.metrics.ended.labels(app="web", outcome="rolled_back")
        assert ended._value.get() == 1


async def test_too_few_requests_decide_nothing() -> None:
    clock, seen = ManualClock(), Figures()
    seen.now = FEW  # 5 errors in 10 requests: no evidence under min_requests (50)
    async with open_store("memory://") as store:
        d = deployer(store, clock, seen)
        rollout = await ramping(store, d)
        clock.advance(10)
        await d.ramps.step(rollout)
        assert (await state(store))[0].split == {"v1": 74, "v2": 26}


async def test_a_split_changed_by_hand_ends_the_ramp_where_it_is() -> None:
    clock, seen = ManualClock(), Figures()
    async with open_store("memory://") as store:
        d = deployer(store, clock, seen)
        rollout = await ramping(store, d)
        await d.traffic.split("web", ["v1=50", "v2=50"])
        clock.advance(30)
        await d.ramps.step(rollout)
        app, _, record = await state(store)
        assert app.split == {"v1": 50, "v2": 50}  # the ramp wrote nothing over it
        assert record.phase == "live" and "set by hand" in record.message


async def test_a_rollback_by_hand_during_a_ramp_ends_it_failed() -> None:
    clock, seen = ManualClock(), Figures()
    async with open_store("memory://") as store:
        d = deployer(store, clock, seen)
        rollout = await ramping(store, d)
        await d.rollback("web")
        await d.ramps.step(rollout)
        app, serving, record = await state(store)
        assert (app.active_version, app.split, serving) == ("v1", {}, {"v1": True, "v2": False})
        assert record.phase == "failed" and "by hand" in record.message


async def test_the_next_leader_carries_a_ramp_on_from_its_record() -> None:
    clock, seen = ManualClock(), Figures()
    async with open_store("memory://") as store:
        await ramping(store, deployer(store, clock, seen))
        clock.advance(25)  # the leader that began it is gone; its heir takes over
        heir = deployer(store, clock, seen)
        [resumed] = await heir.resume()
        assert resumed.phase is Phase.RAMPING and resumed.stable == "v1"

        async def tick(seconds: float) -> None:
            clock.advance(seconds)

        heir.ramps._sleep = tick
        ended = await heir.roll_out(resumed)
        assert ended.phase is Phase.LIVE
        app, serving, record = await state(store)
        assert (app.active_version, app.split, record.phase) == ("v2", {}, "live")
        assert serving == {"v1": False, "v2": True}


async def test_a_deploy_during_a_ramp_ends_it_saying_it_was_replaced() -> None:
    clock, seen = ManualClock(), Figures()
    async with open_store("memory://") as store:
        d = deployer(store, clock, seen)
        rollout = await ramping(store, d)
        third = await d.prepare(AppDefinition(name="web", spec=AppSpec(command=["v3"])), None)
        await routable(store, "sb-3", third.pool)
        assert (await d.roll_out(third)).phase is Phase.LIVE
        record = await store.get(keys.rollout("web", "v2"), RolloutRecord)
        assert record is not None and record.value.phase == "failed"
        assert "replaced by the deploy of v3" in record.value.message
        clock.advance(100)
        await d.ramps.step(rollout)  # the runner takes how it ended, and writes nothing
        assert rollout.phase is Phase.FAILED
        app = await store.get(keys.app("web"), App)
        assert app is not None and (app.value.active_version, app.value.split) == ("v3", {})


@pytest.mark.parametrize(
    ("split", "active", "said"),
    [
        pytest.param({"v1": 74, "v2": 26}, "v1", None, id="as the ramp wrote it"),
        pytest.param({}, "v2", "promoted by hand", id="promoted"),
        pytest.param({}, "v1", "sent back to v1 by hand", id="rolled back"),
        pytest.param({"v1": 100, "v2": 0}, "v1", "sent back to v1", id="new version at 0%"),
        pytest.param({"v1": 50, "v2": 50}, "v1", "set by hand (v1 50%, v2 50%)", id="re-split"),
        pytest.param({"v3": 74, "v2": 26}, "v3", "set by hand", id="stable gone"),
    ],
)
def test_what_a_command_did_to_a_ramp(split: dict[str, int], active: str, said: str | None) -> None:
    rollout = Rollout("web", "v2", "web-v2", Phase.RAMPING, "", 0, stable="v1", share=26)
    app = App(name="web", active_version=active, split=split)
    found = changed_by_hand(app, rollout)
    if said is None:
        assert found is None
    else:
        assert found is not None and said in found[1]
