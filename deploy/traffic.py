"""An app's traffic between its versions: the split (`wakeful traffic`, `promote`, a rollback
during a split) and tags (`wakeful tag`, `untag`), written to the app's record by
compare-and-set together with the pools they need (`wakeful.domain.split` has the rules).

Rules:
- Every version the app routes (`split.routed`: the active one, those the split names, the
  tagged ones) has a pool that is not retired: one retired is brought back, one swept is made
  again from its version, at the version's `min_instances` (a version at 0% scales to zero
  like an idle app, and wakes on its first request). A version that leaves that set has its
  pool retired, in the same transaction as the app's record: no ingress can be sent to a
  version whose pool is gone, and nothing is written half-way.
- Refused, naming why: a stateful app (one writer: two versions would both write its state),
  an app with a rollout under way (its flip would undo the change), a version not deployed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from pydantic import ValidationError

from wakeful.deploy.errors import DeployError, UnknownApp
from wakeful.deploy.rollout import pool_name
from wakeful.domain import keys
from wakeful.domain.models import (
    MAX_TAGS,
    App,
    Pool,
    RolloutRecord,
    Version,
    describe_validation_error,
)
from wakeful.domain.split import (
    LATEST,
    SplitError,
    newest_in_split,
    parse_split,
    routed,
    tag_problem,
    with_split,
)
from wakeful.store import Conflict, Item, Put, Require, Store

ATTEMPTS = 20
"""Compare-and-set attempts before a change is refused as contended."""


class Traffic:
    """Changes to an app's split and tags, each one transaction."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock

    async def split(self, app: str, arguments: Sequence[str]) -> App:
        """`VERSION=PERCENT ...` becomes the app's traffic (`parse_split`, `with_split`)."""

        async def change(found: App, versions: dict[str, Item[Version]]) -> App:
            try:
                weights = parse_split(arguments, list(versions), _latest(versions))
            except SplitError as exc:
                raise DeployError(str(exc)) from exc
            if sum(1 for share in weights.values() if share) > 1:
                _refuse_stateful(found, versions, "split")
            return with_split(found, weights)

        return await self._change(app, change)

    async def promote(self, app: str) -> App:
        """All traffic to the split's newest version (the canary)."""

        async def change(found: App, versions: dict[str, Item[Version]]) -> App:
            target = newest_in_split(found)
            if target is None:
                raise DeployError(f"{app} has no split: there is no version to promote")
            return with_split(found, {target: 100})

        return await self._change(app, change)

    async def back_to_stable(self, app: str) -> App:
        """All traffic to the active (stable) version: a rollback during a split."""

        async def change(found: App, versions: dict[str, Item[Version]]) -> App:
            if not found.split or found.active_version is None:
                raise DeployError(f"{app} has no split")
            return with_split(found, {found.active_version: 100})

        return await self._change(app, change)

    async def tag(self, app: str, tag: str, version: str) -> App:
        """`TAG--APP.<base domain>` reaches `version` (`latest`: the newest)."""

        async def change(found: App, versions: dict[str, Item[Version]]) -> App:
            problem = tag_problem(tag)
            if problem is not None:
                raise DeployError(f"tag {tag!r} {problem}")
            if "--" in app:
                raise DeployError(
                    f"{app!r} holds '--': a tag's host TAG--{app} would read two ways; "
                    "deploy the app under a name without '--' to tag it"
                )
            if len(tag) + 2 + len(app) > 63:
                raise DeployError(
                    f"tag {tag!r}: {tag}--{app} would be longer than a DNS label's 63 "
                    "characters; choose a shorter tag"
                )
            target = _latest(versions) if version == LATEST else version
            if target is None or target not in versions:
                raise DeployError(f"{version!r}: not a deployed version of {app}")
            _refuse_stateful(found, versions, "tag")
            if tag not in found.tags and len(found.tags) >= MAX_TAGS:
                raise DeployError(f"{app} has {MAX_TAGS} tags: untag one first")
            return found.model_copy(update={"tags": {**found.tags, tag: target}})

        return await self._change(app, change)

    async def untag(self, app: str, tag: str) -> App:
        async def change(found: App, versions: dict[str, Item[Version]]) -> App:
            if tag not in found.tags:
                raise UnknownTag(f"{app} has no tag {tag!r}")
            return found.model_copy(
                update={"tags": {t: v for t, v in found.tags.items() if t != tag}}
            )

        return await self._change(app, change)

    async def _change(
        self, app: str, change: Callable[[App, dict[str, Item[Version]]], Awaitable[App]]
    ) -> App:
        for _ in range(ATTEMPTS):
            found = await self._store.get(keys.app(app), App)
            if found is None:
                raise UnknownApp(f"no app named {app!r}")
            rollouts = (await self._store.list(keys.rollouts_of(app), RolloutRecord)).items
            rolling = [r.value.version for r in rollouts if r.value.phase == "rolling"]
            if rolling:
                raise DeployError(
                    f"{app} {rolling[0]} is rolling out: its flip would undo this change; "
                    "wait for it to end (wakeful status)"
                )
            versions = await self.versions(app)
            after = _checked(await change(found.value, versions))
            if after == found.value:
                return after
            try:
                await self.write(found, after, versions)
            except Conflict:
                continue
            return after
        raise DeployError(f"{app} changed too often meanwhile: try again")

    async def versions(self, app: str) -> dict[str, Item[Version]]:
        listed = (await self._store.list(keys.versions_of(app), Version)).items
        return {item.value.version: item for item in listed}

    async def write(
        self,
        found: Item[App],
        after: App,
        versions: dict[str, Item[Version]],
        also: Sequence[Put] = (),
        requires: Sequence[Require] = (),
    ) -> None:
        """`after` in place of the app's record as `found`, with the pool writes it needs
        and `also`, in one transaction; `Conflict` when anything read changed meanwhile."""
        require, ops = await self._pools(found.value, after, versions)
        await self._store.txn(
            [Require(found.key, found.revision), *require, *requires],
            [Put(found.key, after), *ops, *also],
        )

    async def _pools(
        self, before: App, after: App, versions: dict[str, Item[Version]]
    ) -> tuple[list[Require], list[Put]]:
        """The pool writes that go with `after` (this module's first rule)."""
        require: list[Require] = []
        ops: list[Put] = []
        wanted = routed(after)
        for version in sorted(wanted | routed(before)):
            name = pool_name(after.name, version)
            pool = await self._store.get(keys.pool(name), Pool)
            if version not in wanted:
                if pool is not None and not pool.value.retired:
                    retired = {"retired": True, "retired_at": self._clock()}
                    require.append(Require(pool.key, pool.revision))
                    ops.append(Put(pool.key, pool.value.model_copy(update=retired)))
                continue
            record = versions.get(version)
            if record is None:
                raise DeployError(f"version {version} of {after.name} is gone")
            size = record.value.spec.concurrency.min_instances
            require.append(Require(record.key, record.revision))
            if pool is None:
                fresh = Pool(
                    name=name,
                    app=after.name,
                    version=version,
                    spec=record.value.spec,
                    desired_instances=size,
                )
                require.append(Require(keys.pool(name), 0))
                ops.append(Put(keys.pool(name), fresh))
            elif pool.value.retired:
                back = {
                    "retired": False,
                    "retired_at": 0.0,
                    "desired_instances": size,
                    "last_scale": None,
                }
                require.append(Require(pool.key, pool.revision))
                ops.append(Put(pool.key, pool.value.model_copy(update=back)))
        return require, ops


class UnknownTag(UnknownApp):
    """No such tag of the app (404, like an unknown app)."""


def _checked(app: App) -> App:
    """`app` as the store would read it back: a change that breaks a record's own rules (a
    bound, a sum) is refused here, never written (`model_copy` does not validate)."""
    try:
        return App.model_validate(app.model_dump())
    except ValidationError as exc:
        raise DeployError(describe_validation_error(exc)) from exc


def _latest(versions: dict[str, Item[Version]]) -> str | None:
    if not versions:
        return None
    return max(versions.values(), key=lambda item: item.value.created_at).value.version


def _refuse_stateful(found: App, versions: dict[str, Item[Version]], what: str) -> None:
    active = versions.get(found.active_version or "")
    if active is not None and active.value.spec.state is not None:
        raise DeployError(
            f"{found.name} is stateful (one writer): a {what} would route a second version "
            "that writes its state too; deploy, or roll back, instead"
        )
