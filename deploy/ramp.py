"""A progressive rollout (`wakeful deploy DIR --ramp 10m [--canary N]`): once the new version
is ready it takes its first share (the canary's, or 1%) beside the stable version, then moves
to 100% in equal steps over the ramp's duration (`split.ramp_plan`), and is rolled back by
itself when it answers worse than the stable version over the same window (`split.verdict`).

Rules:
- The ramp's state is its rollout record (`rollouts/{app}/{version}`, phase `ramping`): when it
  began, the stable version, the share it last wrote. Every step writes the split and that
  share in one transaction, so a new leader carries the ramp on from the record, by the wall
  clock, at the step it is due.
- Every `CHECK_EVERY` seconds the two versions' answers over the last `WINDOW` seconds (the
  ingresses' reports, `Charts.versions`) go through the verdict with the app's `[rollout]`
  rules. Past a threshold all traffic goes back to the stable version, the new version's pool
  is retired (unless a tag keeps it), and the record ends `failed` with the reason, in one
  transaction.
- The last step promotes: the new version becomes active with all traffic, the stable
  version's pool retired (unless a tag keeps it), the record `live`.
- A split changed by anyone else (`wakeful traffic`, `promote`, `rollback`) ends the ramp
  where it is: the record says so, and no step undoes the change.
- A store error is logged and the check tried again; the ramp never ends a process.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

import anyio
from prometheus_client import CollectorRegistry, Counter

from wakeful.deploy.errors import DeployError
from wakeful.deploy.rollout import Phase, Rollout
from wakeful.deploy.traffic import Traffic
from wakeful.domain import keys
from wakeful.domain.models import App, RolloutRecord, Version
from wakeful.domain.split import SplitError, Thresholds, Window, ramp_plan, verdict, with_split
from wakeful.store import Conflict, Deposed, Item, Put, Require, Store, StoreError

log = logging.getLogger(__name__)

CHECK_EVERY = 2.0
"""Seconds between a ramp's checks (the ingresses report about every 2 s)."""
WINDOW = 60.0
"""Seconds of answers the verdict compares (whole 10 s slots of the activator's ring)."""
NOTHING = Window(0, 0, 0.0)


class RampMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.ended = Counter(
            "wakeful_ramps_ended",
            "Progressive rollouts ended, by outcome: promoted (the last step), rolled_back "
            "(the new version answered worse than the stable one), by_hand (the split was "
            "changed by a command), gone (the app or version was deleted)",
            ["app", "outcome"],
            registry=registry,
        )


class RampRunner:
    """Carries ramping rollouts to 100% or back. One per control plane (the leader runs)."""

    def __init__(
        self,
        store: Store,
        traffic: Traffic,
        windows: Callable[[str, float], dict[str, Window]],
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._store = store
        self._traffic = traffic
        self._windows = windows
        self._clock = clock
        self._sleep = sleep
        self.metrics = RampMetrics(registry)

    async def run(self, rollout: Rollout) -> Rollout:
        """Until the ramp ends (how is in `rollout` and its record). Never raises but
        `Deposed` ends it quietly: the next leader carries it on."""
        while rollout.phase is Phase.RAMPING:
            try:
                await self.step(rollout)
            except Deposed:
                return rollout
            except (StoreError, Conflict) as exc:
                log.warning("ramp of %s %s: %s; trying again", rollout.app, rollout.version, exc)
            if rollout.phase is Phase.RAMPING:
                await self._sleep(CHECK_EVERY)
        return rollout

    async def step(self, rollout: Rollout) -> None:
        """One check: end the ramp, or write its next share when it is due."""
        app = await self._store.get(keys.app(rollout.app), App)
        held = await self._store.get(keys.rollout(rollout.app, rollout.version), RolloutRecord)
        if app is None or held is None:
            return self._end(rollout, Phase.FAILED, "the app or the version was deleted", "gone")
        if held.value.phase != Phase.RAMPING.value:  # ended elsewhere: take how
            self._copy(rollout, held.value)
            return None
        stable = rollout.stable or ""
        version = rollout.version
        split = app.value.split
        by_hand = changed_by_hand(app.value, rollout)
        if by_hand is not None:
            phase, message = by_hand
            return await self._finish(rollout, held, phase, message, "by_hand")
        versions = await self._traffic.versions(rollout.app)
        record = versions.get(version)
        if record is None:
            return self._end(rollout, Phase.FAILED, "the version was deleted", "gone")
        rules = record.value.spec.rollout
        windows = self._windows(rollout.app, WINDOW)
        reason = verdict(
            windows.get(stable, NOTHING),
            windows.get(version, NOTHING),
            Thresholds(
                rules.max_error_ratio,
                rules.max_p99_ratio,
                rules.min_requests,
                rules.min_p99_increase_ms / 1000,
            ),
        )
        if reason is not None:
            back = with_split(app.value, {stable: 100})
            message = (
                f"{rollout.app} {version} rolled back at {split.get(version, 0)}%: {reason}; "
                f"all traffic is back on {stable}"
            )
            await self._commit(app, back, versions, rollout, held, Phase.FAILED, message)
            self.metrics.ended.labels(app=rollout.app, outcome="rolled_back").inc()
            log.warning("%s", message, extra={"app": rollout.app})
            return None
        due = self._due(rollout)
        if due <= rollout.share:
            return None
        if due == 100:
            after = with_split(app.value, {version: 100})
            message = f"{rollout.app} {version} is live: the ramp reached 100%"
            await self._commit(app, after, versions, rollout, held, Phase.LIVE, message)
            self.metrics.ended.labels(app=rollout.app, outcome="promoted").inc()
            log.info("%s", message, extra={"app": rollout.app})
            return None
        after = with_split(app.value, {stable: 100 - due, version: due})
        message = f"{rollout.app} {version} at {due}% beside {stable}"
        await self._commit(app, after, versions, rollout, held, Phase.RAMPING, message, due)
        return None

    def _due(self, rollout: Rollout) -> int:
        """The share the plan gives the new version now."""
        try:
            plan = ramp_plan(max(rollout.canary, 1), rollout.ramp)
        except SplitError as exc:
            raise DeployError(str(exc)) from exc
        elapsed = self._clock() - rollout.ramp_started_at
        return max(share for at, share in plan if at <= elapsed)

    async def _commit(
        self,
        app: Item[App],
        after: App,
        versions: dict[str, Item[Version]],
        rollout: Rollout,
        held: Item[RolloutRecord],
        phase: Phase,
        message: str,
        share: int | None = None,
    ) -> None:
        """The app's record, its pools and the ramp's record, together."""
        ended = dataclasses.replace(
            rollout,
            phase=phase,
            message=message,
            share=share if share is not None else rollout.share,
        )
        await self._traffic.write(
            app,
            after,
            versions,
            also=[Put(held.key, ended.record())],
            requires=[Require(held.key, held.revision)],
        )
        self._copy(rollout, ended.record())

    async def _finish(
        self,
        rollout: Rollout,
        held: Item[RolloutRecord],
        phase: Phase,
        message: str,
        outcome: str,
    ) -> None:
        """End the ramp's record (nothing else changes), counted as `outcome`."""
        ended = dataclasses.replace(
            rollout, phase=phase, message=f"{rollout.app} {rollout.version}: {message}"
        )
        await self._store.txn([Require(held.key, held.revision)], [Put(held.key, ended.record())])
        self._end(rollout, phase, message, outcome)

    def _end(self, rollout: Rollout, phase: Phase, message: str, outcome: str) -> None:
        rollout.phase = phase
        rollout.message = f"{rollout.app} {rollout.version}: {message}"
        self.metrics.ended.labels(app=rollout.app, outcome=outcome).inc()
        log.info("%s", rollout.message, extra={"app": rollout.app})

    @staticmethod
    def _copy(rollout: Rollout, record: RolloutRecord) -> None:
        rollout.phase = Phase(record.phase)
        rollout.message = record.message
        rollout.share = record.share


def changed_by_hand(app: App, rollout: Rollout) -> tuple[Phase, str] | None:
    """How the split differs from what the ramp last wrote (a command changed it), or None."""
    version, stable = rollout.version, rollout.stable
    split = app.split
    if not split and app.active_version == version:
        return Phase.LIVE, "promoted by hand; the ramp is over"
    if split.get(version, 0) == 0:
        back = app.active_version or "-"
        return Phase.FAILED, f"traffic was sent back to {back} by hand; the ramp is over"
    if split.get(version) != rollout.share or stable not in split:
        shares = ", ".join(f"{v} {share}%" for v, share in split.items())
        return Phase.LIVE, f"the split was set by hand ({shares}); the ramp stops there"
    return None
