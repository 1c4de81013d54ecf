"""`ChannelLeases`: the activator's lease channel (`activator/channel.py`), one WebSocket with
many calls in flight, batched both ways. What `wakeful ingress` uses."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from wakeful.activator.channel import PATH as CHANNEL_PATH
from wakeful.activator.client.link import Link
from wakeful.activator.lease_errors import LEASE_GONE, from_channel
from wakeful.aio.listeners import Listeners
from wakeful.domain.leases import (
    ActivatorError,
    LeaseGone,
    LeaseGrant,
    Riders,
    Unauthorized,
    Unreachable,
)
from wakeful.domain.logbatch import access_chunks
from wakeful.domain.traffic import MAX_APPS_PER_REPORT, TrafficReport

log = logging.getLogger(__name__)

REOPEN_PAUSE = 1.0
"""Seconds after a failed attempt to open the lease channel during which calls fail at once."""


def report_chunks(traffic: TrafficReport) -> list[dict[str, Any]]:
    """`traffic` as operations' `apps`, each of at most `MAX_APPS_PER_REPORT` counts (an app's,
    and each of its versions', issue 39): a count is at most ~300 bytes of JSON, so an
    operation stays far below a frame's bound however many versions the apps have."""
    chunks: list[dict[str, Any]] = []
    chunk: dict[str, Any] = {}
    weight = 0
    for app, counts in traffic.items():
        size = 1 + len(counts.versions)
        if chunk and weight + size > MAX_APPS_PER_REPORT:
            chunks.append(chunk)
            chunk, weight = {}, 0
        chunk[app] = counts.model_dump()
        weight += size
    if chunk:
        chunks.append(chunk)
    return chunks


def reopen_at_once(refused: bool, brief_in_a_row: int) -> bool:
    """Whether a lost channel is opened again at once, or counts as a failed attempt (the
    next one in `REOPEN_PAUSE`): `refused`, closed by the activator with 1013 (a bound on
    channels, a standby); `brief_in_a_row`, how many channels running closed within
    `REOPEN_PAUSE` of opening, this one included. One brief close is a takeover's ordinary
    one; two running are an activator that closes every channel (deposed but serving, a
    proxy), which would else be opened again thousands of times a second."""
    return not refused and brief_in_a_row < 2


class ChannelLeases:
    """The activator's lease channel (`activator/channel.py`): one WebSocket, opened on first
    use and again after it is lost; calls made while a frame is on the way go together in the
    next one.

    A call cancelled while its acquire is in flight sends a `cancel`; a grant that still
    arrives for it is released here, so a lease nobody holds is never kept. When the channel
    is lost, every call in flight fails with `Unreachable` (Retry-After 1): acquires are taken
    out of the activator's waiters by the close, and leases already held stay valid, renewed on
    the next channel. At most `per_app` acquires of one app are in flight (invariant 12)."""

    cancels_cleanly = True

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 130.0,
        upkeep_timeout: float = 10.0,
        per_app: int = 128,
        locate: Callable[[], Awaitable[str | None]] | None = None,
        failover: float = 15.0,
    ) -> None:
        """`locate`: where the activator that leads is now (its control API's URL), asked at
        each attempt to open the channel; `base_url` when it knows none. `failover`: how long
        an acquire whose channel was lost, or could not be opened, keeps trying (the time a
        standby needs to take over)."""
        self.refused: str | None = None
        """`Leases.refused`: set by the last attempt to open the channel."""
        self._base_url = base_url
        self._locate = locate
        self._failover = failover
        self._held: dict[str, tuple[str, LeaseGrant]] = {}
        """Leases granted through this client and not handed back, by id, with their app:
        reported to the activator on every new channel (`adopt`), so one that took over, or
        restarted, counts them."""
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout
        self._upkeep_timeout = upkeep_timeout
        self._per_app = per_app
        self._app_slots: dict[str, anyio.Semaphore] = {}
        self._ids = itertools.count(1)
        self.instance = secrets.token_hex(8)
        """This client's random id in its `routes` reports: an ingress of the same name with
        another is another ingress (`wakeful.aio.marks`), whatever channel it reports on."""
        self._link: Link | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._attempt: asyncio.Future[Link] | None = None
        self._failed: tuple[float, ActivatorError] | None = None
        self._closed = False
        self._short: Listeners[[str, str]] = Listeners("that a pool turned short")
        self._routes: tuple[str, int] | None = None
        """The last (ingress, revision) `routes` said: sent again on every new channel."""
        self._opened_at = 0.0
        self._brief = 0
        """Channels in a row that closed within `REOPEN_PAUSE` of opening."""

    def heed_short(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Told (app, version) when the activator says a pool turned short (its news on the
        channel, while one is open); one that raises is logged, and the channel reads on."""
        return self._short.heed(listener)

    def _news(self, news: dict[str, Any]) -> None:
        told = news.get("short")
        if isinstance(told, dict):
            self._short.tell(str(told.get("app", "")), str(told.get("version", "")))

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> LeaseGrant:
        slots = self._app_slots.get(app)
        if slots is None:
            slots = self._app_slots[app] = anyio.Semaphore(self._per_app)
        operation = {"op": "acquire", "app": app, "version": version}
        async with slots:
            answer = await self._acquire_through_failover(operation, riders)
        grant = LeaseGrant.model_validate(answer["grant"])
        self._held[grant.lease_id] = (app, grant)
        return grant

    async def _acquire_through_failover(
        self, operation: dict[str, Any], riders: Riders | None
    ) -> dict[str, Any]:
        """An acquire whose channel is lost (the activator died) or cannot be opened is made
        again, on whichever activator leads by then, for up to `failover` seconds."""
        give_up = time.monotonic() + self._failover
        while True:
            try:
                return await self._call(operation, self._timeout, riders)
            except Unreachable:
                if self._closed or time.monotonic() >= give_up:
                    raise
            await anyio.sleep(REOPEN_PAUSE / 2)

    async def renew(self, lease_id: str, *, used: bool = False) -> LeaseGrant:
        operation = {"op": "renew", "lease": lease_id, "used": used}
        try:
            answer = await self._call(operation, self._upkeep_timeout)
        except LeaseGone:
            self._held.pop(lease_id, None)
            raise
        return LeaseGrant.model_validate(answer["grant"])

    async def release(self, lease_id: str) -> None:
        self._held.pop(lease_id, None)  # a release that fails is the TTL's to finish
        await self._call({"op": "release", "lease": lease_id}, self._upkeep_timeout)

    def access(self, ingress: str, lines: list[dict[str, object]]) -> bool:
        """Sent in the next frame on the open channel; False while no channel is open."""
        link = self._link
        if link is None or not link.alive or self._closed:
            return False
        for chunk in access_chunks(lines):
            operation = {"id": next(self._ids), "op": "access", "ingress": ingress, "lines": chunk}
            link.send(operation).add_done_callback(_retrieved)
        return True

    def report(self, traffic: TrafficReport) -> None:
        """Sent in the next frame on the open channel, answered `recorded`; dropped while no
        channel is open (charts miss a few seconds; nothing else depends on it)."""
        link = self._link
        if not traffic or link is None or not link.alive or self._closed:
            return
        for chunk in report_chunks(traffic):
            operation = {"id": next(self._ids), "op": "traffic", "apps": chunk}
            # The answer (`recorded`, or an error) says nothing the ingress acts on.
            link.send(operation).add_done_callback(_retrieved)

    def routes(self, ingress: str, revision: int | None) -> None:
        """Sent in the next frame on the open channel and on every channel opened after;
        from the first call on, a lost channel is opened again at once (not at the next
        acquire), so the activator that leads knows this ingress even while it is idle.
        None: it stops (drains), said on the open channel: the activator forgets it then,
        and no channel is opened for it any more."""
        if revision is None:
            link = self._link
            if self._routes is not None and link is not None and link.alive:
                link.send(self._routes_op(ingress, None)).add_done_callback(_retrieved)
            self._routes = None
            return
        self._routes = (ingress, revision)
        link = self._link
        if link is not None and link.alive and not self._closed:
            self._report_routes(link)
        else:
            self._link_lost()

    def _report_routes(self, link: Link) -> None:
        if self._routes is not None:
            # An activator that knows no `routes` answers `invalid request`: nothing to do.
            link.send(self._routes_op(*self._routes)).add_done_callback(_retrieved)

    def _routes_op(self, ingress: str, revision: int | None) -> dict[str, Any]:
        return {
            "id": next(self._ids),
            "op": "routes",
            "ingress": ingress,
            "revision": revision,
            "instance": self.instance,
        }

    async def _call(
        self, operation: dict[str, Any], within: float, riders: Riders | None = None
    ) -> dict[str, Any]:
        """One operation, answered. An acquire with `riders` says how many ride it, and
        tells the activator as they join and leave (`ride`, no answer) until answered."""
        try:
            with anyio.fail_after(within):  # opening the channel counts against the call
                link = await self._open()
        except TimeoutError:
            raise Unreachable(f"the activator did not answer in {within:g} s", 1) from None
        ident = next(self._ids)
        if riders is not None:
            operation = {**operation, "requests": max(1, riders.count)}
            riders.watch(lambda by: link.ride(ident, by))
        answered = link.send({"id": ident, **operation})
        try:
            with anyio.fail_after(within):
                answer = await answered
        except TimeoutError:
            link.abandon(ident, operation["op"], answered)
            raise Unreachable(f"the activator did not answer in {within:g} s", 1) from None
        except BaseException:
            link.abandon(ident, operation["op"], answered)
            raise
        finally:
            if riders is not None:
                riders.watch(None)
        if "error" in answer:
            raise from_channel(answer)
        return answer

    async def _open(self) -> Link:
        """The open channel, or one attempt to open it that every caller shares: callers
        never queue behind each other's attempts (each waits for its own deadline only), and
        for `REOPEN_PAUSE` after a failed attempt they fail at once with its error."""
        link = self._link
        if link is not None and link.alive:
            return link
        if self._closed:
            raise Unreachable("the lease channel is closed", 1)
        failed = self._failed
        if failed is not None and time.monotonic() - failed[0] < REOPEN_PAUSE:
            raise failed[1]
        attempt = self._attempt
        if attempt is None or attempt.done():
            attempt = self._attempt = asyncio.ensure_future(self._connect())
            attempt.add_done_callback(_retrieved)
        return await asyncio.shield(attempt)

    async def _connect(self) -> Link:
        try:
            link = await Link.open(await self._channel_url(), self._headers, self._link_lost)
        except ActivatorError as exc:
            self._failed = (time.monotonic(), exc)
            if isinstance(exc, Unauthorized):
                self.refused = str(exc)
            raise
        self._failed = None
        self.refused = None
        link.on_news = self._news  # before its reader's first turn
        if self._closed:  # closed while it opened
            await link.close()
            raise Unreachable("the lease channel is closed", 1)
        self._link = link
        self._opened_at = time.monotonic()
        self._report_held(link)
        self._report_routes(link)
        return link

    async def _channel_url(self) -> str:
        base = self._base_url
        if self._locate is not None:
            try:
                base = await self._locate() or base
            except Exception as exc:  # the store is away: try the configured URL
                log.warning("could not look the leading activator up: %s", exc)
        scheme, _, rest = base.rstrip("/").partition("://")
        return ("wss" if scheme == "https" else "ws") + "://" + rest + CHANNEL_PATH

    def _link_lost(self) -> None:
        """A channel went while leases are held, or routes reported: a new one is opened
        now, not at the next call (for an idle cached lease that may be a third of a lease
        TTL away), so they are reported while an activator that took over still waits for
        them, and deploys wait for this ingress's routes there."""
        link = self._link
        if link is not None and not link.alive and self._failed is None:
            brief = time.monotonic() - self._opened_at < REOPEN_PAUSE
            self._brief = self._brief + 1 if brief else 0
            if not reopen_at_once(link.refused, self._brief):
                why = "would not keep" if link.refused else "keeps closing"
                if self._brief <= 2:  # a spell's first: said once, not every second
                    log.warning("the activator %s the lease channel open: trying again", why)
                self._failed = (time.monotonic(), Unreachable(f"the activator {why} it", 1))
        idle = self._reconnecting is None or self._reconnecting.done()
        if self._wanted_open() and idle:
            self._reconnecting = asyncio.ensure_future(self._reconnect())

    def _wanted_open(self) -> bool:
        return (bool(self._held) or self._routes is not None) and not self._closed

    async def _reconnect(self) -> None:
        told = False
        while self._wanted_open():
            try:
                await self._open()
                return
            except Unauthorized as exc:  # a revoked token: said once, tried again meanwhile
                if not told:
                    log.warning("the lease channel cannot open: %s", exc)
                    told = True
            except ActivatorError:
                pass
            await asyncio.sleep(REOPEN_PAUSE / 2)

    def _report_held(self, link: Link) -> None:
        """Every lease held, first on a new channel: an activator that took over (or
        restarted) counts their capacity before it grants any (invariant 20)."""
        for lease_id, (app, grant) in list(self._held.items()):
            operation = {
                "id": next(self._ids),
                "op": "adopt",
                "app": app,
                "grant": grant.model_dump(mode="json"),
            }
            link.send(operation).add_done_callback(functools.partial(self._adopted, lease_id))

    def _adopted(self, lease_id: str, answer: asyncio.Future[dict[str, Any]]) -> None:
        if answer.cancelled() or answer.exception() is not None:
            return  # the channel went: reported again on the next one
        if answer.result().get("error") == LEASE_GONE:
            self._held.pop(lease_id, None)  # its renewal will say LeaseGone too

    async def aclose(self) -> None:
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnecting
        attempt = self._attempt
        if attempt is not None and not attempt.done():
            attempt.cancel()
            with contextlib.suppress(BaseException):
                await attempt
        if self._link is not None:
            await self._link.close()

    async def __aenter__(self) -> ChannelLeases:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _retrieved(attempt: asyncio.Future[Any]) -> None:
    """An attempt nobody awaits any more (its callers left) must not log its failure."""
    if not attempt.cancelled():
        attempt.exception()
