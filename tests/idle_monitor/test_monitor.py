"""Scale-down of idle pools (invariants 13 and 14): never undoes a concurrent scale-up."""

from __future__ import annotations

import pytest

from wakeful.domain.models import AppSpec, Concurrency, Pool, Sandbox
from wakeful.domain.models import SandboxStatus as S
from wakeful.idle_monitor.monitor import IdleMonitor, idle_plan
from wakeful.store import Store

pytestmark = pytest.mark.anyio


def make_pool(desired: int, *, delay: float = 10, minimum: int = 0, mode: str = "auto") -> Pool:
    concurrency = Concurrency(
        mode=mode,
        scale_down_delay=delay,
        min_instances=minimum,  # type: ignore[arg-type]
        max_instances=minimum if mode == "fixed" else 20,
    )
    return Pool(
        name="p",
        app="a",
        version="v1",
        spec=AppSpec(command=["x"], concurrency=concurrency),
        desired_instances=desired,
    )


def running(
    sid: str, activity: float, status: S = S.RUNNING, *, created: float = 0, ready: float = 0
) -> Sandbox:
    return Sandbox(
        created_at=created,
        ready_at=ready,
        id=sid,
        pool="p",
        app="a",
        node="n",
        status=status,
        ready=True,
        address="127.0.0.1:1",
        last_activity=activity,
    )


@pytest.mark.parametrize(
    ("pool", "sandboxes", "now", "expected"),
    [
        pytest.param(
            make_pool(2),
            [running("a", 95), running("b", 99)],
            100,
            None,
            id="traffic within the delay keeps the pool",
        ),
        pytest.param(
            make_pool(2),
            [running("a", 80), running("b", 99)],
            100,
            1,
            id="one idle sandbox takes one off",
        ),
        pytest.param(
            make_pool(2),
            [running("a", 80), running("b", 85)],
            100,
            0,
            id="an idle pool goes to zero",
        ),
        pytest.param(
            make_pool(2, minimum=1),
            [running("a", 80), running("b", 85)],
            100,
            1,
            id="never below min_instances",
        ),
        pytest.param(
            make_pool(2),
            [running("a", 80, S.SUSPENDED), running("b", 99)],
            100,
            1,
            id="a suspended sandbox idle past the delay is taken off too",
        ),
        pytest.param(
            make_pool(1),
            [running("a", 95, S.SUSPENDED)],
            100,
            None,
            id="one suspended within the delay stays suspended",
        ),
        pytest.param(
            make_pool(1),
            [running("a", 0, created=50, ready=95)],
            100,
            None,
            id="a boot longer than the delay: idle from ready, not from created",
        ),
        pytest.param(
            make_pool(1),
            [running("a", 0, created=50, ready=85)],
            100,
            0,
            id="ready and idle past the delay",
        ),
        pytest.param(
            make_pool(3, minimum=3, mode="fixed"),
            [running("a", 0)],
            100,
            None,
            id="fixed pools are left alone",
        ),
    ],
)
def test_idle_target(
    pool: Pool, sandboxes: list[Sandbox], now: float, expected: int | None
) -> None:
    planned = idle_plan(pool, sandboxes, now)
    assert (None if planned is None else planned[0]) == expected


async def seed(store: Store, desired: int) -> int:
    revision = await store.put("pools/p", make_pool(desired))
    for sid in ("a", "b"):
        await store.put(f"sandboxes/{sid}", running(sid, 0))
    return revision


async def test_an_idle_pool_is_scaled_down_against_the_listed_revision(store: Store) -> None:
    await seed(store, desired=2)
    assert await IdleMonitor(store, clock=lambda: 1000).tick() == ["p"]
    item = await store.get("pools/p", Pool)
    assert item is not None and item.value.desired_instances == 0
    # Why, in the same write: the dashboard's scale event.
    assert item.value.last_scale is not None
    assert (item.value.last_scale.by, item.value.last_scale.at) == ("idle", 1000)
    assert (item.value.last_scale.from_instances, item.value.last_scale.to_instances) == (2, 0)
    assert item.value.last_scale.reason.startswith("idle: 2 sandbox(es) carried no traffic")


async def test_a_scale_up_between_listing_and_write_survives(store: Store) -> None:
    await seed(store, desired=2)
    monitor = IdleMonitor(store, clock=lambda: 1000)
    planned = await monitor.plan()
    assert [(item.value.name, target) for item, target, _ in planned] == [("p", 0)]
    # The activator scales the pool up after the monitor listed it.
    listed = await store.get("pools/p", Pool)
    assert listed is not None
    grown = await store.update(
        "pools/p", listed.value.model_copy(update={"desired_instances": 6}), listed.revision
    )
    assert await monitor.apply(planned) == []
    after = await store.get("pools/p", Pool)
    assert after is not None and after.value.desired_instances == 6 and after.revision == grown


async def test_a_retired_pool_is_deleted_once_empty_and_past_the_retention(store: Store) -> None:
    retired = make_pool(0).model_copy(update={"retired": True, "retired_at": 1000.0})
    await store.put("pools/p", retired)
    await store.put("sandboxes/a", running("a", 0))
    now = [1000.0 + 7200]
    monitor = IdleMonitor(store, retention=3600, clock=lambda: now[0])
    assert await monitor.sweep() == []  # a sandbox still runs in it
    await store.delete("sandboxes/a")
    now[0] = 1000.0 + 100
    assert await monitor.sweep() == []  # not retired long enough
    now[0] = 1000.0 + 3600
    assert await monitor.sweep() == ["p"]
    assert await store.get("pools/p", Pool) is None
    active = make_pool(0)
    await store.put("pools/q", active.model_copy(update={"name": "q"}))
    assert await monitor.sweep() == []  # a pool in use is never swept
