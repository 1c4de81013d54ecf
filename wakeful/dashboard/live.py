"""What keeps the dashboard live: one loop per control plane (not one per browser, nor per row)
and the event streams it feeds.

Every `interval` the loop records scale events (each pool record's `last_scale`, written in the
same compare-and-set as the size), and while a browser listens, builds one snapshot
(`snapshot.py`) and sends it to every stream when it changed, or when `RESEND_SECONDS` passed
(its ages move on). Rollouts are listed from the store every `LIST_SECONDS`, only while
someone watches; nodes that registered once come from the store probe. Streams are bounded
(`MAX_STREAMS`; the route answers 503 past it); each holds at most one unsent snapshot, so a
slow browser gets the newest, never a backlog. When the control plane stops, every stream ends
at once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from wakeful.activator.core import Activator
from wakeful.controller.mirror import Mirror
from wakeful.domain import keys
from wakeful.domain.models import CertRecord, RolloutRecord
from wakeful.store import Store, StoreError

from . import snapshot

log = logging.getLogger(__name__)

MAX_STREAMS = 32
"""Event streams open at once, every browser together."""
MAX_EVENTS = 50
MAX_ROLLOUTS = 20
RESEND_SECONDS = 5.0
"""A snapshot goes out at least this often while it is unchanged: its ages move on."""
SHARE = 20
"""The loop waits at least this many times as long as its last snapshot took to build."""
LIST_SECONDS = 3.0
"""How often rollouts are listed from the store while someone watches."""


class Dashboard:
    """One loop that keeps scale events and feeds every open event stream (module docstring)."""

    def __init__(
        self,
        activator: Activator,
        mirror: Callable[[], Mirror | None],
        store: Store,
        *,
        seen: Callable[[], Iterable[str]] = tuple,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`seen`: every node that ever registered (the store probe's last listing of
        `seen/`, `wakeful.controller.health.StoreProbe`: listed once, not again here)."""
        self._activator = activator
        self._mirror = mirror
        self._seen = seen
        self._store = store
        self._interval = interval
        self._clock = clock
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        """Scale events, newest first."""
        self._seen_scales: dict[str, float] = {}
        """Per pool, the `last_scale.at` already recorded."""
        self._streams: set[asyncio.Queue[str]] = set()
        self._rollouts: list[RolloutRecord] = []
        self._certs: list[CertRecord] = []
        self._listed_at = -LIST_SECONDS
        self._sent = ""
        self._sent_at = 0.0

    @property
    def watched(self) -> bool:
        return bool(self._streams)

    async def run(self) -> None:
        try:
            while True:
                took = 0.0
                try:
                    self._record_scales()
                    if self._streams:
                        await self._list_now_and_then()
                        started = time.perf_counter()
                        self._publish()
                        took = time.perf_counter() - started
                except Exception:  # a chart is never worth the control plane
                    log.exception("the dashboard could not build its snapshot")
                # At most ~5% of the event loop (leases, the API and the election share it):
                # with thousands of apps a snapshot takes longer, and comes less often.
                await anyio.sleep(max(self._interval, took * SHARE))
        finally:
            # The control plane stops: every stream ends now, so the API's graceful shutdown
            # does not wait on them (a browser reconnects to whoever serves next).
            for queue in self._streams:
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait("")

    def _record_scales(self) -> None:
        mirror = self._mirror()
        if mirror is None:
            return
        pools = (item.value for item in mirror.pools.items.values())
        fresh, self._seen_scales = snapshot.scale_events(pools, self._seen_scales)
        for event in fresh:
            self.events.appendleft(event)

    async def _list_now_and_then(self) -> None:
        """Rollouts, from the store every `LIST_SECONDS` (a store away keeps the last
        listing; the page shows the rest)."""
        now = time.monotonic()
        if now - self._listed_at < LIST_SECONDS:
            return
        self._listed_at = now
        try:
            with anyio.fail_after(2):
                rollouts = await self._store.list(keys.ROLLOUTS, RolloutRecord)
                certs = await self._store.list(keys.CERTS, CertRecord)
        except (StoreError, TimeoutError) as exc:
            log.debug("dashboard could not list rollouts and certificates: %s", exc)
            return
        records = sorted((i.value for i in rollouts.items), key=lambda r: -r.started_at)
        self._rollouts = records[:MAX_ROLLOUTS]
        self._certs = [item.value for item in certs.items]

    def snapshot(self) -> dict[str, Any]:
        mirror = self._mirror()
        seen = self._seen() if mirror is not None else ()
        return snapshot.build(
            self._clock(), self._activator, mirror, seen, self._rollouts, self.events, self._certs
        )

    def _publish(self) -> None:
        built = self.snapshot()
        at = built.pop("at")
        body = json.dumps(built, separators=(",", ":"))
        if body == self._sent and at - self._sent_at < RESEND_SECONDS:
            return
        self._sent, self._sent_at = body, at
        message = f'event: snapshot\ndata: {body[:-1]},"at":{at!r}}}\n\n'  # one encoding
        for queue in self._streams:
            if queue.full():  # a browser that reads slowly gets the newest, never a backlog
                queue.get_nowait()
            queue.put_nowait(message)

    def open_stream(self) -> asyncio.Queue[str] | None:
        """A queue of snapshot messages for one more event stream (the current state comes
        first), or None at `MAX_STREAMS`. Counted here, in the same step as the check, so
        streams opened at once cannot pass the bound together; `close_stream` gives it back."""
        if len(self._streams) >= MAX_STREAMS:
            return None
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._streams.add(queue)
        self._sent = ""
        return queue

    def close_stream(self, queue: asyncio.Queue[str]) -> None:
        self._streams.discard(queue)
