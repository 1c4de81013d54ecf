"""A rollout: one version's way to the route, from its pool starting to the flip.

Rules (seed 000 and invariant 4):
- The route flips in one transaction once the new pool has `Rollout.target_ready` ready
  sandboxes (for a full rollout as many as the old one had running; for a canary its share of
  them, for `--keep-split` one). What the flip writes is `flipped`'s: a full rollout makes the
  version active with all traffic; a canary or a ramp's first step gives it a share beside the
  active version; `--keep-split` adds it at 0%. The pools of versions that leave the route
  are retired in the same transaction and drain to zero (a tag keeps one), and a ramp of
  another version under way is ended, saying it was replaced. How the rollout ended goes in
  that transaction too: a record left "rolling" would be resumed, and flipped again, by the
  next leader.
- The hosts are checked again just before the flip, one check-and-flip at a time: another app
  may have taken one since the rollout began, and the control plane carrying it on may reserve
  other names. A rollout refused then is abandoned.
- A new version that is not ready within the deploy timeout, or crash-loops, is abandoned: its
  pool is retired and the old version keeps serving.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, cast

import anyio
from pydantic import ValidationError

from wakeful.deploy.errors import DeployError
from wakeful.domain import keys
from wakeful.domain.hosts import Claim, HostRules, refusal
from wakeful.domain.models import (
    App,
    Pool,
    RolloutRecord,
    Sandbox,
    Version,
    describe_validation_error,
)
from wakeful.domain.split import routed, with_split
from wakeful.store import Conflict, Deposed, Put, Require, Store, StoreError

log = logging.getLogger(__name__)


class Phase(StrEnum):
    UNCHANGED = "unchanged"
    ROLLING = "rolling"
    RAMPING = "ramping"
    LIVE = "live"
    FAILED = "failed"


@dataclass
class Rollout:
    app: str
    version: str
    pool: str
    phase: Phase
    message: str
    target_ready: int
    ready: int = 0
    hosts: list[str] = field(default_factory=list)
    default_host: bool = True
    started_at: float = 0.0
    canary: int = 0
    keep_split: bool = False
    ramp: float = 0.0
    """Seconds from the first share to 100% (`deploy --ramp`; `deploy/ramp.py`)."""
    ramp_started_at: float = 0.0
    stable: str | None = None
    share: int = 0

    def record(self) -> RolloutRecord:
        phase = self.phase.value if self.phase is not Phase.UNCHANGED else "live"
        return RolloutRecord(
            app=self.app,
            version=self.version,
            pool=self.pool,
            phase=cast(Literal["rolling", "ramping", "live", "failed"], phase),
            message=self.message[:4000],
            target_ready=self.target_ready,
            hosts=self.hosts,
            default_host=self.default_host,
            started_at=self.started_at,
            canary=self.canary,
            keep_split=self.keep_split,
            ramp=self.ramp,
            ramp_started_at=self.ramp_started_at,
            stable=self.stable,
            share=self.share,
        )

    @classmethod
    def of(cls, record: RolloutRecord) -> Rollout:
        return cls(
            record.app,
            record.version,
            record.pool,
            Phase(record.phase),
            record.message,
            record.target_ready,
            hosts=list(record.hosts),
            default_host=record.default_host,
            started_at=record.started_at,
            canary=record.canary,
            keep_split=record.keep_split,
            ramp=record.ramp,
            ramp_started_at=record.ramp_started_at,
            stable=record.stable,
            share=record.share,
        )


def pool_name(app: str, version: str) -> str:
    return f"{app}-{version}"


def flipped(
    app: App | None, rollout: Rollout, hosts: list[str], default_host: bool
) -> tuple[App, str]:
    """The app's record once `rollout` flips, and what its rollout then says. An app's first
    version takes all traffic whatever was asked; `--keep-split` (`rollout.keep_split`) adds
    the version at 0% and keeps the split (or the active version's 100%); a canary or a ramp's
    first step (`rollout.canary`) takes its share beside the active version, which stays
    active, and the split's other versions leave the route; a full rollout takes all traffic
    and ends any split. Tags stay."""
    if app is None or app.active_version is None:
        fresh = App(
            name=rollout.app, hosts=hosts, default_host=default_host, active_version=rollout.version
        )
        first = ""
        if rollout.canary or rollout.keep_split or rollout.ramp:
            first = " (the app's first version takes all traffic: there is nothing to split with)"
        return fresh, f"{rollout.app} {rollout.version} is live{first}"
    app = app.model_copy(update={"hosts": hosts, "default_host": default_host})
    active = app.active_version
    if rollout.keep_split and active is not None and active != rollout.version:
        shares = {**(app.split or {active: 100}), rollout.version: 0}
        kept = ", ".join(f"{v} {share}%" for v, share in shares.items() if share)
        message = (
            f"{rollout.app} {rollout.version} is deployed at 0%; the split stays ({kept}): "
            f"wakeful traffic {rollout.app} ..., wakeful tag {rollout.app} {rollout.version} TAG"
        )
        return app.model_copy(update={"split": shares}), message
    if rollout.canary and active is not None and active != rollout.version:
        shares = {active: 100 - rollout.canary, rollout.version: rollout.canary}
        message = (
            f"{rollout.app} {rollout.version} takes {rollout.canary}% beside {active}: "
            f"wakeful promote {rollout.app}, or wakeful rollback {rollout.app}"
        )
        return with_split(app, shares), message
    if active == rollout.version:  # flipped already: keep the previous one it named
        return app.model_copy(update={"split": {}}), f"{rollout.app} {rollout.version} is live"
    record = app.model_copy(
        update={"split": {}, "active_version": rollout.version, "previous_version": active}
    )
    return record, f"{rollout.app} {rollout.version} is live"


async def host_refusal(store: Store, claim: Claim, rules: HostRules) -> str | None:
    """Why `claim` may not be routed, against the apps as they are now (None: it may)."""
    apps = (await store.list(keys.APPS, App)).items
    others = [Claim(a.value.name, a.value.hosts, a.value.default_host) for a in apps]
    return refusal(claim, others, rules)


class RolloutRunner:
    """Carries rollouts to their flip, or abandons them. One per control plane: it holds the
    lock under which a rollout's last host check and its flip happen together."""

    def __init__(
        self, store: Store, rules: HostRules, *, timeout: float, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._rules = rules
        self._timeout = timeout
        self._clock = clock
        self._routing = anyio.Lock()
        """Held from a rollout's last host check to its flip."""

    async def run(self, rollout: Rollout) -> Rollout:
        """Wait for the new pool to be ready enough, then flip the route; or abandon it. How
        it ended goes in its record (`rollouts/{app}/{version}`).

        Never raises (it runs in the control plane's task group): a store outage or a lost
        race fails this rollout, with the reason, and nothing else. `Deposed`: this control
        plane stopped leading; the next one carries the rollout on (`Deployer.resume`).
        """
        try:
            await self.carry(rollout)
        except Deposed:
            return rollout
        except (StoreError, DeployError) as exc:
            rollout.phase = Phase.FAILED
            rollout.message = f"{rollout.app} {rollout.version} failed: {exc}"
            log.error("%s", rollout.message, extra={"app": rollout.app})
        try:
            await self._store.put(keys.rollout(rollout.app, rollout.version), rollout.record())
        except StoreError as exc:
            log.warning("could not record how %s ended: %s", rollout.app, exc)
        return rollout

    async def carry(self, rollout: Rollout) -> Rollout:
        """`run` without its last write: the flip (which records the end with it) or the
        abandonment, raising what the store or a refusal raised."""
        if rollout.phase is not Phase.ROLLING:
            return rollout
        deadline = rollout.started_at + self._timeout
        while rollout.target_ready > 0:
            sandboxes = (await self._store.list(keys.SANDBOXES, Sandbox)).items
            mine = [s.value for s in sandboxes if s.value.pool == rollout.pool]
            rollout.ready = sum(1 for s in mine if s.routable)
            pool = await self._store.get(keys.pool(rollout.pool), Pool)
            if pool is not None and pool.value.crash_count >= 3:
                return await self._abandon(
                    rollout, "crash-looping: " + pool.value.last_crash_log[-2000:]
                )
            if rollout.ready >= rollout.target_ready:
                break
            if self._clock() > deadline:
                return await self._abandon(rollout, f"not ready within {self._timeout:g} s")
            rollout.message = f"{rollout.ready}/{rollout.target_ready} sandboxes ready"
            await anyio.sleep(0.2)
        # Checked again before the route moves: another app may have taken a host since this
        # rollout began, and the control plane carrying it on may reserve other names. One
        # check-and-flip at a time (one control plane leads): two rollouts claiming the same
        # host can no longer both pass their checks before either has flipped.
        async with self._routing:
            claim = Claim(rollout.app, rollout.hosts, rollout.default_host)
            refused = await host_refusal(self._store, claim, self._rules)
            if refused is not None:
                return await self._abandon(rollout, refused)
            ended = await self._flip(rollout, rollout.hosts, rollout.default_host)
        for name in ("phase", "message", "ramp_started_at", "stable", "share"):
            setattr(rollout, name, getattr(ended, name))
        log.info("deployed %s %s", rollout.app, rollout.version, extra={"app": rollout.app})
        return rollout

    async def _flip(self, rollout: Rollout, hosts: list[str], default_host: bool) -> Rollout:
        """Flip the route (`flipped`); returns the rollout as it then is (live, or ramping
        from its first share)."""
        for _ in range(20):
            app = await self._store.get(keys.app(rollout.app), App)
            # The version must still exist when the route points at it: an app deleted during
            # its rollout stays deleted (the check is part of the transaction below).
            version = await self._store.get(keys.version(rollout.app, rollout.version), Version)
            if version is None:
                raise DeployError(f"{rollout.app} was deleted during the rollout")
            record, message = flipped(app.value if app else None, rollout, hosts, default_host)
            try:  # as the store will read it back (`model_copy` does not validate)
                record = App.model_validate(record.model_dump())
            except ValidationError as exc:
                raise DeployError(describe_validation_error(exc)) from exc
            require = [
                Require(keys.app(rollout.app), app.revision if app else 0),
                Require(version.key, version.revision),
            ]
            live = dataclasses.replace(rollout, phase=Phase.LIVE, message=message)
            stable = app.value.active_version if app is not None else None
            if rollout.ramp and rollout.version in record.split and stable in record.split:
                live = dataclasses.replace(
                    live,
                    phase=Phase.RAMPING,
                    ramp_started_at=self._clock(),
                    stable=stable,
                    share=record.split[rollout.version],
                    message=f"{rollout.app} {rollout.version} at {rollout.canary}% beside "
                    f"{stable}, ramping to 100% over {rollout.ramp:g} s",
                )
            # How it ended goes with the flip: a record left "rolling" would be resumed,
            # and flipped again, by the next leader.
            ops: list[Put] = [
                Put(keys.app(rollout.app), record),
                Put(keys.rollout(rollout.app, rollout.version), live.record()),
            ]
            # A ramp of another version under way ends here, saying so: this flip writes the
            # route it was moving (its runner finds its record ended and stops).
            ramps = (await self._store.list(keys.rollouts_of(rollout.app), RolloutRecord)).items
            for ramp in ramps:
                if ramp.value.phase == "ramping" and ramp.value.version != rollout.version:
                    said = (
                        f"{rollout.app} {ramp.value.version}: replaced by the deploy of "
                        f"{rollout.version}; the ramp is over"
                    )
                    ended = ramp.value.model_copy(update={"phase": "failed", "message": said})
                    require.append(Require(ramp.key, ramp.revision))
                    ops.append(Put(ramp.key, ended))
            # Versions the app no longer routes (the old active one, a split's others,
            # unless a tag keeps them) have their pools retired with the flip.
            gone = routed(app.value) - routed(record) if app is not None else set()
            for stale in sorted(gone):
                old = await self._store.get(keys.pool(pool_name(rollout.app, stale)), Pool)
                if old is not None and not old.value.retired:
                    require.append(Require(old.key, old.revision))
                    retired = {"retired": True, "retired_at": self._clock()}
                    ops.append(Put(old.key, old.value.model_copy(update=retired)))
            try:
                await self._store.txn(require, ops)
                return live
            except Conflict:
                continue
        raise DeployError(f"could not flip {rollout.app} to {rollout.version}: too many conflicts")

    async def _abandon(self, rollout: Rollout, reason: str) -> Rollout:
        rollout.phase = Phase.FAILED
        rollout.message = f"{rollout.app} {rollout.version} abandoned: {reason}"
        for _ in range(20):
            pool = await self._store.get(keys.pool(rollout.pool), Pool)
            ended = Put(keys.rollout(rollout.app, rollout.version), rollout.record())
            try:
                if pool is None:
                    await self._store.txn([], [ended])
                    break
                retired = pool.value.model_copy(
                    update={"retired": True, "retired_at": self._clock()}
                )
                await self._store.txn(  # with how it ended, as the flip does
                    [Require(pool.key, pool.revision)], [Put(pool.key, retired), ended]
                )
                break
            except Conflict:
                continue
        log.warning("%s", rollout.message, extra={"app": rollout.app})
        return rollout
