"""Keeping a view of one prefix current: list, then watch from the listing's revision, and list
again whenever continuity is lost. Every component that mirrors the store uses this one loop.

Theory of operation: `reflect` calls the view's `replace` with a full listing, then `put` and
`delete` for each change after it, in revision order, until cancelled. A `Resync` from the
watch (a reconnect, a compaction) or a store error ends the watch; after a back-off that grows
while the store stays unavailable (invariant 19: never an exit), it lists again and calls
`replace`, so the view converges on the store however much it missed. A value that does not
validate is handled as `list` handles it, uniformly: it is logged and the key counts as absent
(a `delete`), so a corrupt record never hides the others and never stops the loop.
"""

from __future__ import annotations

import logging
from typing import Protocol, TypeVar

import anyio
from pydantic import BaseModel

from wakeful.store.base import Event, Item, Resync, Store
from wakeful.store.errors import CorruptValue, StoreError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class View(Protocol[M]):
    """What a component keeps of one prefix. Called from one task only, in order."""

    def replace(self, items: list[Item[M]], revision: int) -> None:
        """The whole prefix as of `revision` (at start, and after every resync)."""

    def put(self, item: Item[M]) -> None:
        """A key was written (created or changed) at `item.revision`."""

    def delete(self, key: str, revision: int) -> None:
        """A key was deleted at `revision`, or its new value does not validate."""


async def reflect(
    store: Store,
    prefix: str,
    model: type[M],
    view: View[M],
    *,
    what: str,
    backoff: float = 0.5,
    max_backoff: float = 5.0,
) -> None:
    """Mirror `prefix` into `view` until cancelled. `what` names the view in logs."""
    delay = backoff
    while True:
        try:
            listing = await store.list(prefix, model)
            view.replace(listing.items, listing.revision)
            delay = backoff
            async for change in store.watch(prefix, listing.revision + 1):
                if isinstance(change, Resync):
                    log.warning(
                        "%s: watch lost continuity (%s); listing again", what, change.reason
                    )
                    break
                apply(view, change, model)
        except StoreError as exc:
            log.warning("%s: store unavailable, retrying in %.1f s: %s", what, delay, exc)
            await anyio.sleep(delay)
            delay = min(delay * 2, max_backoff)


def apply(view: View[M], event: Event, model: type[M]) -> None:
    """One watch event into the view; an invalid value counts as a delete (logged)."""
    if event.kind == "delete":
        view.delete(event.key, event.revision)
        return
    try:
        value = event.decode(model)
    except CorruptValue as exc:
        log.error("ignoring an invalid record: %s", exc, extra={"key": event.key})
        view.delete(event.key, event.revision)
        return
    view.put(Item(event.key, value, event.revision))
