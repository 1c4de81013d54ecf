"""An app's deletion: its route, its versions and its pools' claim on sandboxes go in one
transaction, so no reader sees a route to a version that is gone.

Its pools are retired and marked deleted, so the pool controller drains their sandboxes as in
a scale-down (never one holding a lease) and the idle monitor removes each pool once nothing
runs in it. Its rollout records, its state record and its secrets go in the same transaction
(the state's archive is collected with the artifacts, which the caller collects next).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from wakeful.deploy.errors import DeployError, UnknownApp
from wakeful.domain import keys
from wakeful.domain.models import App, Pool, RolloutRecord, Version
from wakeful.store import Conflict, Delete, Op, Put, Require, Store


@dataclass
class Deletion:
    app: str
    versions: int
    pools: list[str]
    artifacts_removed: int


@dataclass(frozen=True)
class Deleted:
    """What one deletion took away: the versions' names and the pools' names."""

    versions: list[str]
    pools: list[str]


async def delete_records(store: Store, app: str, clock: Callable[[], float]) -> Deleted:
    """The one transaction, tried again while the app's records change under it (20 times
    at most, then `DeployError`); `UnknownApp` when there is no such app."""
    for _ in range(20):
        found = await store.get(keys.app(app), App)
        if found is None:
            raise UnknownApp(f"no app named {app!r}")
        versions = (await store.list(keys.versions_of(app), Version)).items
        pools = [p for p in (await store.list(keys.POOLS, Pool)).items if p.value.app == app]
        records = (await store.list(keys.rollouts_of(app), RolloutRecord)).items
        now = clock()
        require = [Require(found.key, found.revision)]
        require += [Require(v.key, v.revision) for v in versions]
        require += [Require(p.key, p.revision) for p in pools]
        ops: list[Op] = [Delete(found.key), *(Delete(v.key) for v in versions)]
        ops += [Delete(r.key) for r in records]
        ops.append(Delete(keys.state(app)))  # its archive is collected with the artifacts
        ops.append(Delete(keys.secrets(app)))  # a new app of that name starts with none
        for pool in pools:
            retired_at = pool.value.retired_at if pool.value.retired else now
            gone = {"retired": True, "retired_at": retired_at, "deleted": True}
            ops.append(Put(pool.key, pool.value.model_copy(update=gone)))
        try:
            await store.txn(require, ops)
        except Conflict:
            continue
        return Deleted([v.value.version for v in versions], [p.value.name for p in pools])
    raise DeployError(f"could not delete {app!r}: it kept changing under us")
