"""A rollback: the previous version's pool brought back, as a rollout that `RolloutRunner`
then carries to its flip like any other.

A version has no hosts: a rollback routes the app's current ones, checked first as a deploy's
are (they may have become reserved, or another app's, since that version was deployed). The
pool comes back at the current pool's size (at least the version's `min_instances`); one
retired long ago and swept is made again from the version, which still says how to run it.
A stateful app flips at once: the previous version's sandbox can only start once the current
one has stopped and handed its state back.
"""

from __future__ import annotations

from collections.abc import Callable

from wakeful.deploy.errors import DeployError, UnknownApp
from wakeful.deploy.rollout import Phase, Rollout, host_refusal, pool_name
from wakeful.domain import keys
from wakeful.domain.hosts import Claim, HostRules
from wakeful.domain.models import App, Pool, Version
from wakeful.store import Put, Require, Store


async def start_rollback(
    store: Store, app: str, rules: HostRules, clock: Callable[[], float]
) -> Rollout:
    """Write the previous version's pool back (and its rollout record); the rollout is to be
    run. `UnknownApp` when there is no such app; `DeployError` when there is nothing to roll
    back to, or its hosts are refused."""
    found = await store.get(keys.app(app), App)
    if found is None:
        raise UnknownApp(f"no app named {app!r}")
    previous = found.value.previous_version
    if previous is None:
        raise DeployError(f"app {app!r} has no previous version to roll back to")
    claim = Claim(app, found.value.hosts, found.value.default_host)
    refused = await host_refusal(store, claim, rules)
    if refused is not None:
        raise DeployError(
            f"cannot roll back {app}: {refused}; deploy the version you want again, with "
            "hosts that pass"
        )
    version = await store.get(keys.version(app, previous), Version)
    if version is None:
        raise DeployError(f"version {previous} of {app!r} is gone")
    old = await store.get(keys.pool(pool_name(app, previous)), Pool)
    current = await store.get(keys.pool(pool_name(app, found.value.active_version or "")), Pool)
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
        1 if size and version.value.spec.state is None else 0,
        hosts=list(found.value.hosts),
        default_host=found.value.default_host,
        started_at=clock(),
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
    await store.txn(
        [require],
        [Put(keys.pool(name), pool), Put(keys.rollout(app, previous), rollout.record())],
    )
    return rollout
