"""Cached leases follow their sandbox.

When a sandbox leaves admission (draining, stopping, dead, or deleted), every cached lease on
it leaves the cache at once: no new request starts there, and the lease goes back to the
activator as soon as the requests already on it finish, so a scale-down or a drain does not
wait for the lease's idle TTL or its next renewal.
"""

from __future__ import annotations

import logging

import anyio

from wakeful.domain.models import Sandbox
from wakeful.ingress.cache import LeaseCache
from wakeful.store import CorruptValue, Resync, Store, StoreError

log = logging.getLogger(__name__)


async def _drop(cache: LeaseCache, sandbox_id: str) -> None:
    for grant in cache.drop_sandbox(sandbox_id):
        await cache.release(grant)


async def follow_sandboxes(store: Store, cache: LeaseCache) -> None:
    """Until cancelled: drop cached leases on every sandbox that stops being routable."""
    while True:
        try:
            listing = await store.list("sandboxes/", Sandbox)
            for item in listing.items:
                if not item.value.routable:
                    await _drop(cache, item.value.id)
            async for change in store.watch("sandboxes/", listing.revision + 1):
                if isinstance(change, Resync):
                    break
                sandbox_id = change.key.removeprefix("sandboxes/")
                try:
                    leaving = change.kind == "delete" or not change.decode(Sandbox).routable
                except CorruptValue as exc:
                    log.error("ignoring an invalid sandbox record: %s", exc)
                    continue
                if leaving:
                    await _drop(cache, sandbox_id)
        except StoreError as exc:
            log.warning("store unavailable for the sandbox watch: %s", exc)
            await anyio.sleep(1)
