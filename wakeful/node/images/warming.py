"""A deploy warms the image cache: every node unpacks a new version's image as soon as the
version is written, so the first request to wake it does not pay the pull and the unpack.

`Warming` is the agent's view of `versions/` (`wakeful.store.reflector`): versions written
while it watches are queued, those of the first listing are not (a restarted agent would
otherwise unpack every image ever deployed; the active ones come back on their first start).
At most `QUEUED` wait: a burst of deploys keeps the newest. `run` warms them one at a time,
through `warm` (the runtime's, which names the app's uid); a failure is logged and left to
the start, which reports it as the sandbox's reason.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable

import anyio

from wakeful.domain.models import ImageRecord, Version
from wakeful.store import Item

from .errors import ImageError

log = logging.getLogger(__name__)

QUEUED = 8
"""Versions waiting to be warmed at most; the oldest goes first past it."""

Warm = Callable[[ImageRecord, str], Awaitable[None]]


class Warming:
    def __init__(self, warm: Warm) -> None:
        self._warm = warm
        self._queue: collections.deque[tuple[str, ImageRecord]] = collections.deque(maxlen=QUEUED)
        self._listed = False
        self._waiting = anyio.Event()
        self.warmed: collections.deque[str] = collections.deque(maxlen=64)
        """The latest versions warmed, `app/version`, in order (what the tests read)."""

    def replace(self, items: list[Item[Version]], revision: int) -> None:
        self._listed = True  # what existed before: not warmed

    def put(self, item: Item[Version]) -> None:
        version = item.value
        if self._listed and version.image is not None:
            self._queue.append((f"{version.app}/{version.version}", version.image))
            self._waiting.set()

    def delete(self, key: str, revision: int) -> None:
        pass

    async def run(self) -> None:
        while True:
            await self._waiting.wait()
            self._waiting = anyio.Event()
            while self._queue:
                name, image = self._queue.popleft()
                app = name.partition("/")[0]
                try:
                    await self._warm(image, app)
                except (ImageError, OSError) as exc:
                    log.warning("could not warm %s's image %s: %s", name, image.ref, exc)
                    continue
                except Exception:  # best effort: never the agent's end (its start says why)
                    log.exception("could not warm %s's image %s", name, image.ref)
                    continue
                self.warmed.append(name)
                log.info("warmed %s's image %s", name, image.ref)
