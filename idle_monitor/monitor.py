"""Scale-down of idle pools, against the revision it listed (seed 000, invariants 13 and 14).

Each tick lists the pools and sandboxes. In an `auto` pool a running or suspended sandbox is
idle when it has carried no traffic (a lease taken, released, or renewed after use) for the
app's `scale_down_delay` (a suspended one was frozen after `suspend_delay` of that and stays
in the pool until then); the new size is `max(min_instances, desired - idle)`. The write is
`update(pool, expect_revision=<the listing's revision>)`: a scale-up made between the listing
and the write makes it conflict, and the monitor does nothing more for that pool this tick.
It never undoes a scale-up. Which sandboxes stop is the pool controller's choice (idle ones
without leases first), and a stopping sandbox finishes its requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import anyio
from pydantic import Field

from wakeful.domain import keys
from wakeful.domain.models import STARTING, Pool, Sandbox, SandboxStatus, ScaleChange
from wakeful.store import Conflict, Item, Store, StoreError
from wakeful.store.settings import StoreSettings

log = logging.getLogger(__name__)


IDLE_CANDIDATES = frozenset({SandboxStatus.RUNNING, SandboxStatus.SUSPENDED})
"""What may count as idle: serving, or frozen for want of traffic."""


class IdleMonitorSettings(StoreSettings):
    idle_interval: float = Field(default=30.0, gt=0, le=3600)
    """Seconds between ticks."""
    retired_retention: float = Field(default=3600.0, ge=0)
    """A retired pool with nothing running is deleted this long after it was retired."""


def sweepable(pool: Pool, sandboxes: Sequence[Sandbox], now: float, retention: float) -> bool:
    """A retired pool nothing runs in any more, retired long enough ago to forget (or at
    once, when its app was deleted)."""
    forgotten = pool.deleted or (pool.retired_at > 0 and now - pool.retired_at >= retention)
    return pool.retired and forgotten and not any(s.pool == pool.name for s in sandboxes)


def idle_plan(pool: Pool, sandboxes: Sequence[Sandbox], now: float) -> tuple[int, int] | None:
    """The smaller size an idle pool should have and how many running sandboxes were idle
    (the reason the write records), or None to leave it alone."""
    concurrency = pool.spec.concurrency
    if concurrency.mode == "fixed" or pool.retired or pool.desired_instances == 0:
        return None
    running = [s for s in sandboxes if s.pool == pool.name and s.status in IDLE_CANDIDATES]
    idle = sum(
        1
        for s in running
        if now - max(s.last_activity, s.created_at, s.ready_at) >= concurrency.scale_down_delay
    )
    booting = any(s.pool == pool.name and s.status in STARTING for s in sandboxes)
    if idle == 0 or booting:
        return None
    target = max(concurrency.min_instances, pool.desired_instances - idle)
    return (target, idle) if target < pool.desired_instances else None


class IdleMonitor:
    def __init__(
        self,
        store: Store,
        *,
        interval: float = 30.0,
        retention: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._interval = interval
        self._retention = retention
        self._clock = clock

    async def run(self) -> None:
        while True:
            await anyio.sleep(self._interval)
            try:
                await self.tick()
            except StoreError as exc:
                log.warning("idle monitor could not list pools: %s", exc)

    async def tick(self) -> list[str]:
        """One pass; returns the pools it scaled down."""
        scaled = await self.apply(await self.plan())
        await self.sweep()
        return scaled

    async def sweep(self) -> list[str]:
        """Delete retired pools with nothing left running, past the retention time."""
        pools = await self._store.list(keys.POOLS, Pool)
        sandboxes = [s.value for s in (await self._store.list(keys.SANDBOXES, Sandbox)).items]
        now = self._clock()
        swept = []
        for item in pools.items:
            if sweepable(item.value, sandboxes, now, self._retention):
                try:
                    await self._store.delete(item.key, expect_revision=item.revision)
                except Conflict:
                    continue
                log.info(
                    "deleted retired pool %s", item.value.name, extra={"pool": item.value.name}
                )
                swept.append(item.value.name)
        return swept

    async def plan(self) -> list[tuple[Item[Pool], int, int]]:
        """Pools to shrink, each with the listed item whose revision the write must match, the
        target size and how many sandboxes were idle."""
        pools = await self._store.list(keys.POOLS, Pool)
        sandboxes = [s.value for s in (await self._store.list(keys.SANDBOXES, Sandbox)).items]
        now = self._clock()
        found = []
        for item in pools.items:
            planned = idle_plan(item.value, sandboxes, now)
            if planned is not None:
                found.append((item, *planned))
        return found

    async def apply(self, planned: list[tuple[Item[Pool], int, int]]) -> list[str]:
        scaled = []
        for item, target, idle in planned:
            pool = item.value
            delay = pool.spec.concurrency.scale_down_delay
            change = ScaleChange(
                at=self._clock(),
                by="idle",
                from_instances=pool.desired_instances,
                to_instances=target,
                reason=f"idle: {idle} sandbox(es) carried no traffic for {delay:g} s",
            )
            smaller = pool.model_copy(update={"desired_instances": target, "last_scale": change})
            try:
                await self._store.update(item.key, smaller, expect_revision=item.revision)
            except Conflict:
                log.info(
                    "pool changed since listed; looking again next tick",
                    extra={"pool": item.value.name},
                )
                continue
            log.info(
                "scaled idle pool %s from %d to %d",
                item.value.name,
                item.value.desired_instances,
                target,
                extra={"pool": item.value.name},
            )
            scaled.append(item.value.name)
        return scaled
