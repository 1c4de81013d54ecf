"""Deploys: a validated definition and an artifact become a version, a pool, and a route flip.

Rules (seed 000 and invariant 4):
- An unchanged deploy (same spec, hosts and artifact as the active version) is a no-op.
- A reserved host (an IP address, `localhost`, the base domain or a wildcard over the apps'
  default hosts, a name the control plane answers on), a host that overlaps another app's,
  another app's default host, or a default host another app's hosts take refuses the deploy
  before anything is written (`wakeful.domain.hosts`). A rollback is checked the same way,
  and every rollout again just before its route flips (it is abandoned if refused then).
- A new version's pool starts at the size of the pool it replaces (never below min_instances,
  at least 1 when the old one was serving), so a busy app's new version does not start on one
  sandbox and take the whole load there.
- The route flips (App.active_version) in one transaction once the new pool has as many ready
  sandboxes as the old one had running; the old pool is retired in the same transaction and
  drains to zero. A new version that is not ready within the deploy timeout, or crash-loops,
  is abandoned: its pool is retired and the old version keeps serving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, cast

import anyio

from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.collect import ArtifactCollector
from wakeful.domain import keys
from wakeful.domain.hosts import Claim, HostRules, refusal
from wakeful.domain.models import App, Pool, RolloutRecord, Sandbox, SandboxStatus, Version
from wakeful.store import Conflict, Delete, Deposed, Item, Op, Put, Require, Store, StoreError

log = logging.getLogger(__name__)


class DeployError(ValueError):
    pass


class UnknownApp(DeployError):
    pass


@dataclass
class Deletion:
    app: str
    versions: int
    pools: list[str]
    artifacts_removed: int


class Phase(StrEnum):
    UNCHANGED = "unchanged"
    ROLLING = "rolling"
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

    def record(self) -> RolloutRecord:
        phase = self.phase.value if self.phase is not Phase.UNCHANGED else "live"
        return RolloutRecord(
            app=self.app,
            version=self.version,
            pool=self.pool,
            phase=cast(Literal["rolling", "live", "failed"], phase),
            message=self.message[:4000],
            target_ready=self.target_ready,
            hosts=self.hosts,
            default_host=self.default_host,
            started_at=self.started_at,
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
        )


def pool_name(app: str, version: str) -> str:
    return f"{app}-{version}"


def starting_size(old: Pool | None, old_running: int, new_min: int) -> int:
    """The new pool starts where the old one is, so traffic does not pile onto one sandbox."""
    if old is None:
        return new_min
    size = max(old.desired_instances, old_running, new_min)
    return max(size, 1) if old_running > 0 else size


class Deployer:
    def __init__(
        self,
        store: Store,
        artifacts: LocalArtifacts,
        *,
        collector: ArtifactCollector | None = None,
        timeout: float = 300.0,
        clock: Callable[[], float] = time.time,
        hosts: HostRules | None = None,
    ) -> None:
        """`collector`: deletes the artifacts an app deletion leaves unreferenced (by
        default one with the default grace period, on `clock`). `hosts`: the base domain and
        the control plane's names (`ActivatorSettings.host_rules`; by default `localhost` and
        none)."""
        self._store = store
        self._hosts = hosts if hosts is not None else HostRules()
        self._routing = anyio.Lock()
        """Held from a rollout's last host check to its flip."""
        self._artifacts = artifacts
        self.collector = collector or ArtifactCollector(store, artifacts, clock=clock)
        self._timeout = timeout
        self._clock = clock
        self.rollouts: dict[tuple[str, str], Rollout] = {}

    async def prepare(self, definition: AppDefinition, artifact: str | None) -> Rollout:
        """Validate, then write the new version and its pool (not yet routed)."""
        # Claimed (its grace period starts again) so the collector leaves it alone until the
        # version below references it.
        if artifact is not None and not await self._artifacts.keep(artifact):
            raise DeployError(f"artifact {artifact} was not uploaded")
        name = definition.name
        refused = await self._refusal(Claim(name, definition.hosts, definition.default_host))
        if refused is not None:
            raise DeployError(refused)
        app = await self._store.get(keys.app(name), App)
        versions = (await self._store.list(keys.versions_of(name), Version)).items
        active = None
        if app is not None and app.value.active_version is not None:
            active = next(
                (v for v in versions if v.value.version == app.value.active_version), None
            )
        if (
            active is not None
            and app is not None
            and active.value.spec == definition.spec
            and active.value.artifact == artifact
            and app.value.hosts == definition.hosts
            and app.value.default_host == definition.default_host
        ):
            version = active.value.version
            return Rollout(
                name,
                version,
                pool_name(name, version),
                Phase.UNCHANGED,
                f"{name} {version} is already deployed; nothing changed",
                0,
            )
        number = 1 + max(
            (int(v.value.version[1:]) for v in versions if v.value.version[1:].isdigit()), default=0
        )
        version = f"v{number}"
        old_pool = None
        old_running = 0
        if app is not None and app.value.active_version is not None:
            found = await self._store.get(
                keys.pool(pool_name(name, app.value.active_version)), Pool
            )
            old_pool = found.value if found else None
            sandboxes = (await self._store.list(keys.SANDBOXES, Sandbox)).items
            old_running = sum(  # a suspended one serves too: it wakes in milliseconds
                1
                for s in sandboxes
                if old_pool
                and s.value.pool == old_pool.name
                and (s.value.routable or s.value.status is SandboxStatus.SUSPENDED)
            )
        size = starting_size(old_pool, old_running, definition.spec.concurrency.min_instances)
        size = min(size, definition.spec.concurrency.max_instances)
        record = Version(
            app=name,
            version=version,
            spec=definition.spec,
            artifact=artifact,
            created_at=self._clock(),
        )
        pool = Pool(
            name=pool_name(name, version),
            app=name,
            version=version,
            spec=definition.spec,
            desired_instances=size,
        )
        rollout = Rollout(
            name,
            version,
            pool.name,
            Phase.ROLLING,
            f"{name} {version}: starting {size} sandbox(es)"
            if definition.spec.state is None
            else f"{name} {version}: stateful, so the old version hands its state over first",
            # A stateful app has one writer: the route flips at once and the new version
            # starts once the old one has stopped and handed its state back (requests wait).
            old_running if definition.spec.state is None else 0,
            hosts=list(definition.hosts),
            default_host=definition.default_host,
            started_at=self._clock(),
        )
        await self._store.txn(
            [Require(keys.version(name, version), 0), Require(keys.pool(pool.name), 0)],
            [
                Put(keys.version(name, version), record),
                Put(keys.pool(pool.name), pool),
                Put(keys.rollout(name, version), rollout.record()),
            ],
        )
        self.rollouts[(name, version)] = rollout
        return rollout

    async def _refusal(self, claim: Claim) -> str | None:
        """Why `claim` may not be routed, against the apps as they are now (None: it may)."""
        apps = (await self._store.list(keys.APPS, App)).items
        others = [Claim(a.value.name, a.value.hosts, a.value.default_host) for a in apps]
        return refusal(claim, others, self._hosts)

    async def roll_out(self, rollout: Rollout) -> Rollout:
        """Wait for the new pool to be ready enough, then flip the route; or abandon it. How
        it ended goes in its record (`rollouts/{app}/{version}`).

        Never raises (it runs in the control plane's task group): a store outage or a lost
        race fails this rollout, with the reason, and nothing else. `Deposed`: this control
        plane stopped leading; the next one carries the rollout on (`resume`).
        """
        try:
            await self._roll_out(rollout)
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

    async def resume(self) -> list[Rollout]:
        """The rollouts another control plane left under way (it stopped leading): carried on
        here, each within its deadline from when it began. Returns them; the caller runs
        `roll_out` on each."""
        found = []
        for item in (await self._store.list(keys.ROLLOUTS, RolloutRecord)).items:
            record = item.value
            if record.phase != "rolling" or (record.app, record.version) in self.rollouts:
                continue
            app = await self._store.get(keys.app(record.app), App)
            active = app.value.active_version if app is not None else None
            replaced = False
            if active is not None and active != record.version:
                current = await self._store.get(keys.version(record.app, active), Version)
                replaced = current is not None and current.value.created_at > record.started_at
            if active == record.version or replaced:
                # It flipped (its end was not written), or a version deployed after it began
                # replaced it: carrying it on would take the route back.
                phase = "live" if active == record.version else "failed"
                message = f"{record.app} {record.version} is {phase} ({active} is active)"
                ended = record.model_copy(update={"phase": phase, "message": message})
                with contextlib.suppress(Conflict):
                    await self._store.update(item.key, ended, item.revision)
                continue
            rollout = self.rollouts[(record.app, record.version)] = Rollout.of(record)
            log.info("resuming the rollout of %s %s", record.app, record.version)
            found.append(rollout)
        return found

    async def progress(self, app: str, version: str) -> Rollout | None:
        """A rollout this control plane runs, or the record of one (run by another, or
        finished before this one led)."""
        rollout = self.rollouts.get((app, version))
        if rollout is not None:
            return rollout
        found = await self._store.get(keys.rollout(app, version), RolloutRecord)
        return None if found is None else Rollout.of(found.value)

    async def _roll_out(self, rollout: Rollout) -> Rollout:
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
            refused = await self._refusal(claim)
            if refused is not None:
                return await self._abandon(rollout, refused)
            await self._flip(rollout, rollout.hosts, rollout.default_host)
        rollout.phase = Phase.LIVE
        rollout.message = f"{rollout.app} {rollout.version} is live"
        log.info("deployed %s %s", rollout.app, rollout.version, extra={"app": rollout.app})
        return rollout

    async def _flip(self, rollout: Rollout, hosts: list[str], default_host: bool) -> None:
        for _ in range(20):
            app = await self._store.get(keys.app(rollout.app), App)
            # The version must still exist when the route points at it: an app deleted during
            # its rollout stays deleted (the check is part of the transaction below).
            version = await self._store.get(keys.version(rollout.app, rollout.version), Version)
            if version is None:
                raise DeployError(f"{rollout.app} was deleted during the rollout")
            previous = app.value.active_version if app else None
            if app is not None and previous == rollout.version:  # flipped already: keep it
                previous = app.value.previous_version
            record = App(
                name=rollout.app,
                hosts=hosts,
                default_host=default_host,
                active_version=rollout.version,
                previous_version=previous if previous != rollout.version else None,
            )
            require = [
                Require(keys.app(rollout.app), app.revision if app else 0),
                Require(version.key, version.revision),
            ]
            live = dataclasses.replace(
                rollout, phase=Phase.LIVE, message=f"{rollout.app} {rollout.version} is live"
            )
            # How it ended goes with the flip: a record left "rolling" would be resumed,
            # and flipped again, by the next leader.
            ops: list[Put] = [
                Put(keys.app(rollout.app), record),
                Put(keys.rollout(rollout.app, rollout.version), live.record()),
            ]
            active = app.value.active_version if app else None
            if active is not None and active != rollout.version:
                old = await self._store.get(keys.pool(pool_name(rollout.app, active)), Pool)
                if old is not None:
                    require.append(Require(old.key, old.revision))
                    retired = {"retired": True, "retired_at": self._clock()}
                    ops.append(Put(old.key, old.value.model_copy(update=retired)))
            try:
                await self._store.txn(require, ops)
                return
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

    async def delete(self, app: str) -> Deletion:
        """Delete an app: its route, its versions and its pools' claim on sandboxes go in one
        transaction (so no reader sees a route to a version that is gone); its pools are
        retired and marked deleted, so the pool controller drains their sandboxes as in a
        scale-down (never one holding a lease) and the idle monitor removes each pool once
        nothing runs in it. The artifact collector then runs: artifacts no remaining version
        uses are deleted, unless uploaded within its grace period (another deploy may be about
        to use one)."""
        for _ in range(20):
            found = await self._store.get(keys.app(app), App)
            if found is None:
                raise UnknownApp(f"no app named {app!r}")
            versions = (await self._store.list(keys.versions_of(app), Version)).items
            pools = [
                p for p in (await self._store.list(keys.POOLS, Pool)).items if p.value.app == app
            ]
            records = (await self._store.list(keys.rollouts_of(app), RolloutRecord)).items
            now = self._clock()
            require = [Require(found.key, found.revision)]
            require += [Require(v.key, v.revision) for v in versions]
            require += [Require(p.key, p.revision) for p in pools]
            ops: list[Op] = [Delete(found.key), *(Delete(v.key) for v in versions)]
            ops += [Delete(r.key) for r in records]
            ops.append(Delete(keys.state(app)))  # its archive is collected with the artifacts
            for pool in pools:
                retired_at = pool.value.retired_at if pool.value.retired else now
                gone = {"retired": True, "retired_at": retired_at, "deleted": True}
                ops.append(Put(pool.key, pool.value.model_copy(update=gone)))
            try:
                await self._store.txn(require, ops)
            except Conflict:
                continue
            break
        else:
            raise DeployError(f"could not delete {app!r}: it kept changing under us")
        for version in versions:
            self.rollouts.pop((app, version.value.version), None)
        removed = await self.collector.collect_quietly()
        log.info("deleted app %s", app, extra={"app": app})
        return Deletion(app, len(versions), [p.value.name for p in pools], len(removed))

    async def rollback(self, app: str) -> Rollout:
        """Bring the previous version's pool back (at the current size); `roll_out` flips."""
        found = await self._store.get(keys.app(app), App)
        if found is None:
            raise DeployError(f"no app named {app!r}")
        previous = found.value.previous_version
        if previous is None:
            raise DeployError(f"app {app!r} has no previous version to roll back to")
        # A version has no hosts: a rollback routes the app's current ones, which may have
        # become reserved (or another app's) since they were deployed.
        refused = await self._refusal(Claim(app, found.value.hosts, found.value.default_host))
        if refused is not None:
            raise DeployError(
                f"cannot roll back {app}: {refused}; deploy the version you want again, with "
                "hosts that pass"
            )
        version = await self._store.get(keys.version(app, previous), Version)
        if version is None:
            raise DeployError(f"version {previous} of {app!r} is gone")
        old = await self._store.get(keys.pool(pool_name(app, previous)), Pool)
        current = await self._store.get(
            keys.pool(pool_name(app, found.value.active_version or "")), Pool
        )
        size = max(
            current.value.desired_instances if current else 0,
            version.value.spec.concurrency.min_instances,
        )
        name = pool_name(app, previous)
        rollout = Rollout(
            app,
            previous,
            name,
            Phase.ROLLING,
            f"rolling back {app} to {previous}",
            # A stateful app flips at once: the previous version's sandbox can only start
            # once the current one has stopped and handed its state back.
            1 if size and version.value.spec.state is None else 0,
            hosts=list(found.value.hosts),
            default_host=found.value.default_host,
            started_at=self._clock(),
        )
        if old is None:  # retired long ago and swept: the version still says how to run it
            pool = Pool(
                name=name,
                app=app,
                version=previous,
                spec=version.value.spec,
                desired_instances=size,
            )
            require = Require(keys.pool(name), 0)
        else:
            # `last_scale` explained the old size: this one is the rollback's.
            back = {
                "retired": False,
                "retired_at": 0.0,
                "desired_instances": size,
                "last_scale": None,
            }
            pool = old.value.model_copy(update=back)
            require = Require(old.key, old.revision)
        await self._store.txn(
            [require],
            [Put(keys.pool(name), pool), Put(keys.rollout(app, previous), rollout.record())],
        )
        self.rollouts[(app, previous)] = rollout
        return rollout


__all__ = ["Deletion", "Deployer", "Item", "UnknownApp"]
