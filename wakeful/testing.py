"""For tests and benchmarks: a clock you drive, a lease service in memory (`FakeLeases`, which
passes the same contract suite as the activator in-process and over HTTP), and the command line
of a `wakeful up` on given loopback ports."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from wakeful.aio.listeners import Listeners
from wakeful.aio.marks import Marks
from wakeful.domain.leases import LeaseGone, LeaseGrant, NoCapacity, Riders, UnknownApp, short
from wakeful.domain.traffic import TrafficReport


class ManualClock:
    """A clock that moves only when told: pass it wherever a component takes `clock`, then
    `advance()` past a deadline instead of sleeping until it."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock does not go back (advance by {seconds})")
        self.now += seconds
        return self.now


@dataclass(frozen=True)
class FakeSandbox:
    sandbox_id: str
    url: str
    capacity: int = 1
    """How many requests it takes at once; a lease has size 1 here."""


class FakeLeases:
    """`wakeful.domain.leases.Leases` in memory, for tests of what holds leases (the ingress):
    fixed sandboxes per app; a lease of size 1 on the first sandbox with room, and when every
    one is full an overflow lease of size 1 on the least loaded (as the activator admits over
    target, invariant 2); `UnknownApp` for an app it was not given, `NoCapacity` for an app
    with no sandbox; `LeaseGone` on renewing a lease that was released. Release is
    idempotent. `leased` shows what each sandbox carries.

    `size`: a normal lease's size (an overflow lease is always 1). `hold`: awaited by every
    acquire before it is decided, as a request parked at the activator waits (a test lets
    grants out one by one). `cancels_cleanly`: see below. An overflow grant makes its app
    short for a while (`short`, on `clock`): renewals then ask for spare leases
    (`LeaseGrant.spare_wanted`), and the listeners of `heed_short` are told as it turns so."""

    def __init__(
        self,
        apps: Mapping[str, Sequence[FakeSandbox]],
        ttl: float = 60.0,
        *,
        size: int = 1,
        hold: Callable[[], Awaitable[object]] | None = None,
        cancels_cleanly: bool = True,
        on_version: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._apps = {app: list(sandboxes) for app, sandboxes in apps.items()}
        self._on_version = on_version
        """The version every grant says it is on, whatever was asked ("": none said), as an
        activator that falls back to the active version does (`View.resolve`)."""
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._short_at: dict[str, float] = {}
        """When each app last got an overflow lease."""
        self._told_short: Listeners[[str, str]] = Listeners("that an app turned short")
        """Every listener of `heed_short` (each ingress sharing this fake)."""
        self.routes_seen = Marks(settle=0)
        """The routes revision each ingress sharing this fake said, as the activator keeps it."""
        self._apps_of: dict[str, str] = {}
        """The app of each lease held."""
        self._hold = hold
        self.cancels_cleanly = cancels_cleanly
        self.refused: str | None = None
        """`Leases.refused`: a test sets it as an activator refusing the token would."""
        """As the real adapters say it (`Leases.cancels_cleanly`): True like the in-process one
        (a cancelled acquire made no grant), False to stand in for plain HTTP's."""
        self._ids = itertools.count(1)
        self._leases: dict[str, LeaseGrant] = {}
        self.reports: list[TrafficReport] = []
        self.access_lines: list[dict[str, object]] = []
        """Every traffic report the ingress sent, in order."""
        self.asks: list[int] = []
        """How many rode each acquire when it was made, in order: how the ingress shares."""
        self.riders: list[Riders] = []
        """Each acquire's riders, as they are now (requests join and leave while it waits)."""
        self.leased: dict[str, int] = {
            s.sandbox_id: 0 for sandboxes in self._apps.values() for s in sandboxes
        }

    def report(self, traffic: TrafficReport) -> None:
        self.reports.append(traffic)

    def routes(self, ingress: str, revision: int | None) -> None:
        if revision is None:
            self.routes_seen.gone((self, ingress), linger=False)
        else:
            self.routes_seen.saw((self, ingress), ingress, revision)

    def heed_short(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        return self._told_short.heed(listener)

    def tell_short(self, app: str, version: str) -> None:
        """Tell the listeners a pool of `app` on `version` turned short, as an activator with
        pools this fake does not have would (another version's, during a rollout)."""
        self._told_short.tell(app, version)

    @property
    def heeding(self) -> int:
        """How many listen to `heed_short` now (a closed lease cache has stopped)."""
        return len(self._told_short)

    def access(self, ingress: str, lines: list[dict[str, object]]) -> bool:
        self.access_lines.extend(lines)
        return True

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> LeaseGrant:
        self.asks.append(1 if riders is None else riders.count)
        self.riders.append(riders or Riders())
        if self._hold is not None:
            await self._hold()
        sandboxes = self._apps.get(app)
        if sandboxes is None:
            raise UnknownApp(f"no app named {app!r}")
        if not sandboxes:
            raise NoCapacity(f"{app!r} has no sandbox", retry_after=1)
        size = self._size
        room = [s for s in sandboxes if self.leased[s.sandbox_id] + size <= s.capacity]
        chosen = room[0] if room else min(sandboxes, key=lambda s: self.leased[s.sandbox_id])
        size = size if room else 1
        self.leased[chosen.sandbox_id] += size
        grant = LeaseGrant(
            lease_id=f"fake-{next(self._ids)}",
            sandbox_id=chosen.sandbox_id,
            url=chosen.url,
            size=size,
            overflow=not room,
            ttl_seconds=self._ttl,
            version=self._on_version,
        )
        self._leases[grant.lease_id] = grant
        self._apps_of[grant.lease_id] = app
        if grant.overflow:
            was = short(self._short_at.get(app), self._clock())
            self._short_at[app] = self._clock()
            if not was:  # it turns short: its holders hear it now, as the activator's do
                self._told_short.tell(app, grant.version)
        return grant

    async def renew(self, lease_id: str, *, used: bool = False) -> LeaseGrant:
        grant = self._leases.get(lease_id)
        if grant is None:
            raise LeaseGone(f"no lease {lease_id!r}")
        wanted = short(self._short_at.get(self._apps_of[lease_id]), self._clock())
        return grant.model_copy(update={"spare_wanted": wanted})

    async def release(self, lease_id: str) -> None:
        grant = self._leases.pop(lease_id, None)
        self._apps_of.pop(lease_id, None)
        if grant is not None:
            self.leased[grant.sandbox_id] -= grant.size


def up_command(
    data_dir: Path,
    apps: Sequence[Path],
    *,
    proxy: int,
    api: int,
    admin: int,
    idle_interval: float,
    flags: Sequence[str] = (),
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "wakeful.cli",
        "--data-dir",
        str(data_dir),
        "up",
        *map(str, apps),
        "--listen",
        f"127.0.0.1:{proxy}",
        "--api-listen",
        f"127.0.0.1:{api}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--idle-interval",
        str(idle_interval),
        *flags,
    ]
