"""Keeping views of store prefixes current: list, then watch from the listing's revision, and
list again whenever continuity is lost. Every component that mirrors the store uses this one
loop (the activator's view, the ingress's routing table and lease cache, the node agent, the
pool controller's change signal).

Theory of operation: `reflect_all` lists each feed's prefix and calls its view's `replace`
with the full listing, then `listed`; then it watches once, from the oldest listing's
revision, and calls `put` and `delete` on the feed whose prefix the key is under, in revision
order, until cancelled. An event a feed's listing already contained (its revision is not newer
than that listing's) is skipped, so each view sees every change exactly once. A `Resync` from
the watch (a reconnect, a compaction) or a store error ends the watch; after a back-off that
grows while the store stays unavailable (invariant 19: never an exit), it lists again, so the
views converge on the store however much they missed. A value that does not validate is
handled as `list` handles it, uniformly: it is logged and the key counts as absent (a
`delete`), so a corrupt record never hides the others and never stops the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import anyio
from pydantic import BaseModel

from wakeful.domain.backoff import Backoff, Retries
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


@dataclass(frozen=True)
class Feed(Generic[M]):
    """One prefix, the model its values validate against, and the view that mirrors it."""

    prefix: str
    model: type[M]
    view: View[M]


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
    await reflect_all(
        store, [Feed(prefix, model, view)], what=what, backoff=backoff, max_backoff=max_backoff
    )


async def reflect_all(
    store: Store,
    feeds: Sequence[Feed[Any]],
    *,
    what: str,
    listed: Callable[[], None] | None = None,
    relisting: Callable[[], None] | None = None,
    backoff: float = 0.5,
    max_backoff: float = 5.0,
) -> None:
    """Mirror every feed's prefix into its view, on one watch, until cancelled.

    `listed` is called after every full listing, once every view has been replaced;
    `relisting` before each (the first, and every one after a lost watch), while the views
    are about to be replaced one by one, each as of its own revision.
    """
    prefix = shared_prefix([feed.prefix for feed in feeds])
    retries = Retries(Backoff(backoff, max_backoff))
    while True:
        try:
            if relisting is not None:
                relisting()
            revisions: list[int] = []
            for feed in feeds:
                listing = await store.list(feed.prefix, feed.model)
                feed.view.replace(listing.items, listing.revision)
                revisions.append(listing.revision)
            if listed is not None:
                listed()
            retries.succeeded()
            async for change in store.watch(prefix, min(revisions) + 1):
                if isinstance(change, Resync):
                    log.warning(
                        "%s: watch lost continuity (%s); listing again", what, change.reason
                    )
                    break
                for feed, revision in zip(feeds, revisions, strict=True):
                    if change.key.startswith(feed.prefix):
                        if change.revision > revision:
                            apply(feed.view, change, feed.model)
                        break
        except StoreError as exc:
            delay = retries.failed()
            log.warning("%s: store unavailable, retrying in %.1f s: %s", what, delay, exc)
            await anyio.sleep(delay)


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


def shared_prefix(prefixes: Sequence[str]) -> str:
    """The longest string every prefix starts with (store keys are strings, not paths)."""
    first = min(prefixes, default="")
    last = max(prefixes, default="")
    for i, char in enumerate(first):
        if last[i] != char:
            return first[:i]
    return first
