"""Deploys: a validated definition and an artifact become a version, a pool, and a rollout.

`Deployer` is what the control API and `wakeful up` deploy through; it writes a deploy's
records here and hands the rest to one module per step: `rollout.py` carries a rollout to
its flip (or abandons it), `rollback.py` starts a rollback, `deletion.py` deletes an app.

Rules of a deploy (seed 000 and invariant 4):
- An unchanged deploy (same spec, hosts and artifact as the active version) is a no-op.
- A reserved host (an IP address, `localhost`, the base domain or a wildcard over the apps'
  default hosts, a name the control plane answers on), a host that overlaps another app's,
  another app's default host, or a default host another app's hosts take refuses the deploy
  before anything is written (`wakeful.domain.hosts`). A rollback is checked the same way,
  and every rollout again just before its route flips (it is abandoned if refused then).
- A manifest whose `env` sets a name the app also has as a secret is refused, naming both,
  before anything is written; the version is written only if the app's secrets are still as
  read (`wakeful secrets set` checks the other way round).
- A new version is numbered one past the highest `vN` the app has had (`next_version`).
- A new version's pool starts at the size of the pool it replaces (never below min_instances,
  at least 1 when the old one was serving), so a busy app's new version does not start on one
  sandbox and take the whole load there.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry

from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.collect import ArtifactCollector
from wakeful.deploy.deletion import Deletion, delete_records
from wakeful.deploy.errors import DeployError
from wakeful.deploy.ramp import RampRunner
from wakeful.deploy.rollback import start_rollback
from wakeful.deploy.rollout import Phase, Rollout, RolloutRunner, host_refusal, pool_name
from wakeful.deploy.traffic import Traffic
from wakeful.domain import keys
from wakeful.domain.hosts import Claim, HostRules
from wakeful.domain.models import (
    App,
    AppSecrets,
    ImageRecord,
    Pool,
    RolloutRecord,
    Sandbox,
    SandboxStatus,
    Version,
    manifest_overlap,
)
from wakeful.domain.split import Window
from wakeful.store import Conflict, Item, Put, Require, Store

log = logging.getLogger(__name__)

PREPARE_ATTEMPTS = 5
"""A deploy's write, decided again from fresh reads, before a concurrent change refuses it."""


def starting_size(old: Pool | None, old_running: int, new_min: int) -> int:
    """The new pool starts where the old one is, so traffic does not pile onto one sandbox."""
    if old is None:
        return new_min
    size = max(old.desired_instances, old_running, new_min)
    return max(size, 1) if old_running > 0 else size


def next_version(versions: Iterable[str]) -> str:
    """One past the highest number among an app's versions (`v1` for the first), so a number
    is never given twice. A version's number is what follows its first letter; a name whose
    rest is not all digits does not count."""
    number = 1 + max((int(v[1:]) for v in versions if v[1:].isdigit()), default=0)
    return f"v{number}"


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
        windows: Callable[[str, float], dict[str, Window]] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """`collector`: deletes the artifacts an app deletion leaves unreferenced (by
        default one with the default grace period, on `clock`). `hosts`: the base domain and
        the control plane's names (`ActivatorSettings.host_rules`; by default `localhost` and
        none)."""
        self._store = store
        self._hosts = hosts if hosts is not None else HostRules()
        self._artifacts = artifacts
        self.collector = collector or ArtifactCollector(store, artifacts, clock=clock)
        self._clock = clock
        self.runner = RolloutRunner(store, self._hosts, timeout=timeout, clock=clock)
        self.rollouts: dict[tuple[str, str], Rollout] = {}
        self.traffic = Traffic(store, clock)
        """Splits and tags (`traffic.py`)."""
        self.windows = windows or (lambda app, seconds: {})
        """What each version of a split or tagged app answered over the last seconds (the
        activator's `version_windows`; none without one)."""
        self.ramps = RampRunner(store, self.traffic, self.windows, clock=clock, registry=registry)
        """Carries `--ramp` rollouts on from their first share (`ramp.py`)."""

    async def prepare(
        self,
        definition: AppDefinition,
        artifact: str | None,
        image: ImageRecord | None = None,
        made: str | None = None,
        canary: int = 0,
        ramp: float = 0.0,
        keep_split: bool = False,
    ) -> Rollout:
        """Validate, then write the new version and its pool (not yet routed). Decided again
        from fresh reads when a record it read changed before its write (a `secrets set` or
        a key rotation touching the app's secrets, another deploy of the app). `canary`: the
        share (percent) the version takes beside the active one once ready (0: all); `ramp`:
        seconds over which it then goes to 100% (`ramp.py`), from `canary` or 1%;
        `keep_split`: it joins the route at 0%, the split as it is (none of the others)."""
        if keep_split and (canary or ramp):
            raise DeployError("--keep-split keeps the split as it is: give no --canary or --ramp")
        if ramp and not canary:
            canary = 1
        if (canary or keep_split) and definition.spec.state is not None:
            raise DeployError(
                f"{definition.name} is stateful (one writer): a canary, a ramp or a kept split "
                "would route two versions that both write its state; deploy without --canary, "
                "--ramp and --keep-split"
            )
        # Claimed (its grace period starts again) so the collector leaves it alone until the
        # version below references it.
        if artifact is not None and not await self._artifacts.keep(artifact):
            raise DeployError(f"artifact {artifact} was not uploaded")
        for _ in range(PREPARE_ATTEMPTS - 1):
            with contextlib.suppress(Conflict):
                return await self._prepare(
                    definition, artifact, image, made, canary, ramp, keep_split
                )
        return await self._prepare(definition, artifact, image, made, canary, ramp, keep_split)

    async def check(self, definition: AppDefinition) -> None:
        """Refuse what would be refused anyway, before anything slow (an image's pull) is
        done for it: its hosts, an env that sets one of its secrets. `_prepare` checks both
        again, on what it writes against."""
        await self._refusal(definition)

    async def _refusal(self, definition: AppDefinition) -> Item[AppSecrets] | None:
        """DeployError for hosts it may not claim or an env that sets one of its secrets; the
        app's secrets record as read."""
        name = definition.name
        claim = Claim(name, definition.hosts, definition.default_host)
        refused = await host_refusal(self._store, claim, self._hosts)
        if refused is not None:
            raise DeployError(refused)
        secrets = await self._store.get(keys.secrets(name), AppSecrets)
        if secrets is not None:
            both = manifest_overlap(definition.spec.env, secrets.value.values)
            if both:
                listed = ", ".join(both)
                raise DeployError(
                    f"env sets {listed}, which {name} also has as a secret: take {listed} out "
                    "of wakeful.toml's env (the secret is used), or `wakeful secrets unset` it"
                )
        return secrets

    async def _prepare(
        self,
        definition: AppDefinition,
        artifact: str | None,
        image: ImageRecord | None,
        made: str | None,
        canary: int = 0,
        ramp: float = 0.0,
        keep_split: bool = False,
    ) -> Rollout:
        name = definition.name
        secrets = await self._refusal(definition)
        app = await self._store.get(keys.app(name), App)
        if app is None and "--" in name:  # an app of such a name from before tags stays
            raise DeployError(
                f"{name!r}: an app name holds no '--', which separates a tag from its app in "
                "a tagged version's host (TAG--APP.<base domain>)"
            )
        if (
            definition.spec.state is not None
            and app is not None
            and (app.value.split or app.value.tags)
        ):
            raise DeployError(
                f"{name} has a split or tags, and this version is stateful (one writer): "
                f"end the split (wakeful traffic {name} VERSION=100) and untag every version "
                "first, so that no other version writes its state"
            )
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
            and active.value.image == image
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
        version = next_version(v.value.version for v in versions)
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
        target = old_running
        if canary and old_pool is not None:  # its share of the old pool's size, at least one
            share = -(-old_running * canary // 100)
            size = max(definition.spec.concurrency.min_instances, share)
            target = min(old_running, max(share, 1))
        elif keep_split and old_pool is not None:  # checked ready on one, then at 0%
            size = max(definition.spec.concurrency.min_instances, 1)
            target = min(old_running, 1)
        size = min(size, definition.spec.concurrency.max_instances)
        record = Version(
            app=name,
            version=version,
            spec=definition.spec,
            artifact=artifact,
            image=image,
            created_at=self._clock(),
            made=made,
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
            min(target, size) if definition.spec.state is None else 0,
            hosts=list(definition.hosts),
            default_host=definition.default_host,
            started_at=self._clock(),
            canary=canary,
            ramp=ramp,
            keep_split=keep_split,
        )
        await self._store.txn(
            [
                Require(keys.version(name, version), 0),
                Require(keys.pool(pool.name), 0),
                # a secret set meanwhile (under a name this env sets?): Conflict, decided again
                Require(keys.secrets(name), secrets.revision if secrets is not None else 0),
            ],
            [
                Put(keys.version(name, version), record),
                Put(keys.pool(pool.name), pool),
                Put(keys.rollout(name, version), rollout.record()),
            ],
        )
        self.rollouts[(name, version)] = rollout
        return rollout

    async def roll_out(self, rollout: Rollout) -> Rollout:
        """`RolloutRunner.run`: to the flip or abandoned, how it ended recorded; then a ramp
        from its first share to its end (`RampRunner.run`). Never raises."""
        if rollout.phase is not Phase.RAMPING:
            rollout = await self.runner.run(rollout)
        if rollout.phase is Phase.RAMPING:
            rollout = await self.ramps.run(rollout)
        return rollout

    async def resume(self) -> list[Rollout]:
        """The rollouts another control plane left under way (it stopped leading): carried on
        here, each within its deadline from when it began. Returns them; the caller runs
        `roll_out` on each."""
        found = []
        for item in (await self._store.list(keys.ROLLOUTS, RolloutRecord)).items:
            record = item.value
            if (record.app, record.version) in self.rollouts:
                continue
            if record.phase == "ramping":  # flipped to its first share: the ramp goes on
                rollout = self.rollouts[(record.app, record.version)] = Rollout.of(record)
                log.info("resuming the ramp of %s %s", record.app, record.version)
                found.append(rollout)
                continue
            if record.phase != "rolling":
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

    async def delete(self, app: str) -> Deletion:
        """Delete an app (`deletion.py`), then run the artifact collector: artifacts no
        remaining version uses are deleted, unless uploaded within its grace period (another
        deploy may be about to use one)."""
        deleted = await delete_records(self._store, app, self._clock)
        for version in deleted.versions:
            self.rollouts.pop((app, version), None)
        removed = await self.collector.collect_quietly()
        log.info("deleted app %s", app, extra={"app": app})
        return Deletion(app, len(deleted.versions), deleted.pools, len(removed))

    async def rollback(self, app: str) -> Rollout:
        """During a split, all traffic back to the active (stable) version at once; else
        bring the previous version's pool back (`rollback.py`), and `roll_out` flips."""
        found = await self._store.get(keys.app(app), App)
        if found is not None and found.value.split and found.value.active_version:
            stable = found.value.active_version
            await self.traffic.back_to_stable(app)
            return Rollout(
                app,
                stable,
                pool_name(app, stable),
                Phase.LIVE,
                f"{app}: all traffic back to {stable}; the split is over",
                0,
            )
        rollout = await start_rollback(self._store, app, self._hosts, self._clock)
        self.rollouts[(app, rollout.version)] = rollout
        return rollout
