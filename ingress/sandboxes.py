"""Cached leases follow their sandbox.

When a sandbox leaves admission (draining, stopping, dead, or deleted), every cached lease on
it leaves the cache at once: no new request starts there, and the lease goes back to the
activator as soon as the requests already on it finish, so a scale-down or a drain does not
wait for the lease's idle TTL or its next renewal.
"""

from __future__ import annotations

import anyio
import anyio.abc

from wakeful.domain import keys
from wakeful.domain.models import Sandbox
from wakeful.ingress.cache import LeaseCache
from wakeful.store import Item, Store
from wakeful.store.reflector import reflect


class _Leaving:
    """A view of `sandboxes/` that only acts: a sandbox that is not routable (or gone) has its
    cached leases dropped at once, and handed back once their requests finish."""

    def __init__(self, cache: LeaseCache, tasks: anyio.abc.TaskGroup) -> None:
        self._cache = cache
        self._tasks = tasks

    def replace(self, items: list[Item[Sandbox]], revision: int) -> None:
        for item in items:
            self.put(item)
        # A sandbox deleted while the watch was away is in no listing: drop its leases too.
        listed = {item.value.id for item in items}
        for held in {entry.grant.sandbox_id for entry in self._cache.snapshot()} - listed:
            self._drop(held)

    def put(self, item: Item[Sandbox]) -> None:
        if not item.value.routable:
            self._drop(item.value.id)

    def delete(self, key: str, revision: int) -> None:
        self._drop(keys.name_in(key, keys.SANDBOXES))

    def _drop(self, sandbox_id: str) -> None:
        for grant in self._cache.drop_sandbox(sandbox_id):
            self._tasks.start_soon(self._cache.release, grant)


async def follow_sandboxes(store: Store, cache: LeaseCache) -> None:
    """Until cancelled: drop cached leases on every sandbox that stops being routable."""
    async with anyio.create_task_group() as tasks:
        await reflect(store, keys.SANDBOXES, Sandbox, _Leaving(cache, tasks), what="lease cache")
