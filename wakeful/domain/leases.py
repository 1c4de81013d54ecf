"""The lease interface between the ingress and the activator: what a grant says (`LeaseGrant`),
what the ingress may ask (`Leases`), and what can go wrong (each error's code and fields on
the lease channel and over HTTP are one table's, `activator/lease_errors.py`).

ActivatorError
├── UnknownApp        no such app or version (404)
├── LeaseGone         renew of a lease that expired, was released or lost its sandbox (404)
├── Unavailable       capacity cannot be had now; carries retry_after (503 + Retry-After)
│   ├── NoCapacity      nothing became routable within the activation timeout
│   ├── Overloaded      the pool's waiter queue is full
│   ├── AppFailedToBoot the app's sandboxes keep dying at boot; carries their last log
│   └── Unreachable     the activator itself did not answer, or stopped leading (raised by
│                       the adapters that talk to it over the network, and by one deposed)
└── Unauthorized      missing or wrong bearer token, or one of another role (401, 403;
                      raised by the network adapters)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from wakeful.domain.traffic import TrafficReport

CHANNEL_MAX_FRAME_BYTES = 1 << 20
"""The largest frame of the lease channel (`activator/channel.py`) the control API takes,
and so the largest WebSocket frame of any ASGI server of ours: 1,000 operations fit in a
third of it."""


class ActivatorError(Exception):
    """Base of every error the activator raises."""


class UnknownApp(ActivatorError):
    pass


class LeaseGone(ActivatorError):
    pass


class Unauthorized(ActivatorError):
    pass


class Unavailable(ActivatorError):
    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, round(retry_after))


class NoCapacity(Unavailable):
    pass


class Overloaded(Unavailable):
    pass


class Unreachable(Unavailable):
    pass


class AppFailedToBoot(Unavailable):
    def __init__(self, message: str, retry_after: float, log: str) -> None:
        super().__init__(message, retry_after)
        self.log = log


MAX_ASK_REQUESTS = 1000
"""The most requests one ask may stand for (`Leases.acquire`), on the wire: as many as an
activator parks by default (`max_waiters`)."""


SHORT_SECONDS = 10.0
"""How long after a request of a pool got less than a normal lease its renewals ask holders
for the normal leases they are not using (`short`)."""


def short(short_at: float | None, now: float, waiting: int = 0) -> bool:
    """Whether a pool is short of normal capacity: a request of it got an overflow lease, or
    waited with every routable sandbox at its hard limit, within `SHORT_SECONDS`; or
    requests of it wait now (`waiting`). Its renewals then ask each holder for the normal
    leases it is not using (`LeaseGrant.spare_wanted`), so normal leases spread over the
    ingresses that ask instead of staying with one for its idle TTL. A parked request runs
    admission again only when its pool changes, so `short_at` alone would stop asking
    `SHORT_SECONDS` after it parked while it still waits (up to its activation timeout),
    before a holder of quiet leases renews them (every lease TTL / 3)."""
    return waiting > 0 or (short_at is not None and now - short_at < SHORT_SECONDS)


class Riders:
    """The requests waiting on one ask of the activator (`Leases.acquire`). An ingress's
    misses that wait together share an ask; requests join it and leave while it is out, and
    whoever carries the ask follows the count through `watch` (the activator counts a parked
    ask as the requests riding it: one slot per waiting request, seed 000)."""

    __slots__ = ("_count", "_watcher")

    def __init__(self, count: int = 1) -> None:
        self._count = count
        self._watcher: Callable[[int], None] | None = None

    @property
    def count(self) -> int:
        return self._count

    def change(self, by: int) -> None:
        """`by` requests joined (or left, negative)."""
        self._count += by
        if self._watcher is not None and by:
            self._watcher(by)

    def watch(self, watcher: Callable[[int], None] | None) -> None:
        """Told each change from now on (None: no more)."""
        self._watcher = watcher


class LeaseGrant(BaseModel):
    """A lease as its holder sees it: `size` concurrent requests on one sandbox at `url`."""

    lease_id: str
    sandbox_id: str
    url: str
    size: int
    overflow: bool
    ttl_seconds: float
    woke_after: float = Field(default=0.0, ge=0)
    """Seconds the request that asked for it waited for its app to wake (it was parked while
    none of the pool's sandboxes was ready); 0 when capacity was there or merely busy."""
    woke_by: Literal["", "thaw", "start"] = ""
    """How the app woke for it: `thaw` (a suspended sandbox) or `start` (a new one)."""
    server_timing: bool = False
    """The app asks for `Server-Timing` on its answers (`AppSpec.server_timing`)."""
    access_log: bool = False
    """The app asks for an access line per request (`AppSpec.access_log`)."""
    access_log_query: bool = False
    """Its access lines keep the query string (`AppSpec.access_log_query`)."""
    protocol: Literal["http1", "h2c"] = "http1"
    """What its sandboxes speak (`AppSpec.protocol`): HTTP/1.1, or cleartext HTTP/2."""
    version: str = Field(default="", max_length=63)
    """The version whose pool the lease is on: the one asked for, or the active one when
    the one asked for no longer serves ("" from an activator that does not say)."""
    spare_wanted: bool = False
    """Said on a renewal: the lease's pool is short of normal capacity (a request of it got
    an overflow lease, or waited at the hard limit, moments ago). The holder hands back the
    normal leases of the pool it is not using now rather than keep them its idle TTL, so
    they go to the ingresses that need them."""


class Leases(Protocol):
    """What the ingress needs of the activator, in-process or over HTTP."""

    refused: str | None
    """Why the activator refuses this ingress's token, while it does (the lease channel's
    open answered 401 or 403): the ingress is not ready meanwhile (`/readyz`), since every
    request would get 503. None otherwise, and in-process or over plain HTTP."""

    cancels_cleanly: bool
    """Cancelling an `acquire` loses no grant: the activator forgets the waiter, or a grant
    that crosses the cancel is handed back (in-process; the lease channel). Over plain HTTP a
    grant the activator sent just as the caller left is lost until its TTL."""

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> LeaseGrant:
        """A lease on a sandbox of the app. `riders`: the requests waiting on this one ask
        (an ingress's misses that wait together share one, `ingress.cache`), followed while
        it is out; a parked ask counts as that many in the demand that sizes the pool. None:
        one request."""
        ...

    async def renew(self, lease_id: str, *, used: bool = False) -> LeaseGrant: ...

    async def release(self, lease_id: str) -> None: ...

    def report(self, traffic: TrafficReport) -> None:
        """What the ingress answered per app since its last report, for the activator's
        charts (`wakeful.domain.traffic`). Best effort: never waits, and a report that cannot
        go now (no channel open) is dropped."""

    def access(self, ingress: str, lines: list[dict[str, object]]) -> bool:
        """Access lines (`wakeful.domain.logbatch.AccessLine`'s fields) for the control
        plane's log, beside the report. Never waits; False when they cannot go now (no
        channel open): the caller keeps them for the next report."""

    def routes(self, ingress: str, revision: int | None) -> None:
        """The revision of `apps/` this ingress's routes have followed
        (`RoutingTable.revision`), for a deploy that waits until every ingress routes what it
        wrote (`GET /v1/apps/{app}/routed`); None: it stops, wait for it no more. Never
        waits. Known in-process and on the lease channel, which stays open for it from then
        on (the activator knows an ingress by its channel, and tells the revision to the
        next one); over plain HTTP, nowhere."""

    def heed_short(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Tell `listener` (app, version) as a pool of the app turns short, between
        renewals (`activator.spares`), where the activator can say so: in-process and on
        the lease channel; never over plain HTTP, where only renewals say it
        (`LeaseGrant.spare_wanted`). Returns what stops it."""
        ...
