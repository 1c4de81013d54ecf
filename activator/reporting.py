"""What the activator shows of itself: a snapshot of each pool (`/v1/pools`, the pool metrics,
the dashboard) and the dashboard's per-app charts (`Charts`: the ingresses' traffic reports,
the waiters sampled each second, how apps woke for their waiting requests). Everything here
reads the view and the ledger and writes neither."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from wakeful.activator.ledger import LeaseLedger
from wakeful.activator.view import View
from wakeful.domain.split import Window, routed
from wakeful.domain.traffic import TrafficReport, TrafficRing, quantile

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WakeTally:
    """An app's requests that waited for it to wake, by how it woke, and the latest one: what
    the dashboard shows (`Server-Timing` says it per request)."""

    thaw: int = 0
    start: int = 0
    last_kind: str = ""
    last_seconds: float = 0.0
    last_at: float = 0.0
    """Wall-clock time of the latest."""

    def add(self, kind: str, waited: float, at: float) -> None:
        if kind == "thaw":
            self.thaw += 1
        else:
            self.start += 1
        self.last_kind, self.last_seconds, self.last_at = kind, waited, at


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    pool: str
    app: str
    version: str
    state: str
    """`active` (takes traffic), `draining` (retired, sandboxes still finishing) or `retired`."""
    desired_instances: int
    """What the pool controller acts on: 0 for a retired pool, whatever its record says."""
    live: int
    ready: int
    suspended: int
    """Of `live`: frozen, waking in milliseconds on the next request."""
    leased: int
    overflow: int
    waiters: int
    crashes: int
    """Crashes in a row (the pool controller's count; a sandbox that becomes ready ends it)."""
    revision: int


def pool_snapshots(view: View, ledger: LeaseLedger) -> list[PoolSnapshot]:
    """Every pool of the view, by name."""
    found = []
    leased = ledger.leased_capacity_by_sandbox
    for name in sorted(view.pools):
        state = view.pools[name]
        pool = state.item.value
        live = view.live(state)
        _, overflow, waiters = ledger.counts(name)
        found.append(
            PoolSnapshot(
                pool=name,
                app=pool.app,
                version=pool.version,
                state=("draining" if live else "retired") if pool.retired else "active",
                desired_instances=0 if pool.retired else pool.desired_instances,
                live=live,
                ready=view.ready(state),
                suspended=len(view.suspended(state)),
                leased=sum(leased.get(s, 0) for s in state.sandboxes),
                overflow=overflow,
                waiters=waiters,
                crashes=pool.crash_count,
                revision=state.item.revision,
            )
        )
    return found


def waiting_by_app(view: View, ledger: LeaseLedger) -> dict[str, int]:
    """Each app's parked requests, its pools added up; apps without any left out."""
    waiting: dict[str, int] = {}
    for name, state in view.pools.items():
        count = ledger.waiting(name)
        if count:
            app = state.item.value.app
            waiting[app] = waiting.get(app, 0) + count
    return waiting


def version_key(app: str, version: str) -> str:
    """A version's key in the traffic ring (no app name holds `/`)."""
    return f"{app}/{version}"


class Charts:
    """Each app's last 15 minutes for the dashboard, and how it woke for its waiting
    requests, kept for the apps the view knows."""

    def __init__(
        self, view: View, ledger: LeaseLedger, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self._view = view
        self._ledger = ledger
        self._wall_clock = wall_clock
        self.traffic = TrafficRing()
        """The last 15 minutes of each app's traffic, from the ingresses' reports (`record`)
        and the activator's waiters (`sample`)."""
        self._wakes: dict[str, WakeTally] = {}

    def record(self, report: TrafficReport) -> int:
        """An ingress's traffic report (`Leases.report`), into the ring; apps the view does
        not know are left out (the ring holds known apps only). Returns how many went in."""
        now = self._wall_clock()
        recorded = 0
        for app, counts in report.items():
            found = self._view.apps.get(app)
            if found is None:
                continue
            self.traffic.add(app, counts, now)
            recorded += 1
            record = found.value
            if counts.versions and (record.split or record.tags):  # each version's own too
                serving = routed(record)
                for version, of in counts.versions.items():
                    if version in serving:
                        self.traffic.add(version_key(app, version), of, now)
        return recorded

    def versions(self, app: str, seconds: float) -> dict[str, Window]:
        """Each version the app routes, over the last `seconds` (whole slots of the ring),
        while it has a split or tags (the ring keeps versions only then)."""
        found = self._view.apps.get(app)
        if found is None or not (found.value.split or found.value.tags):
            return {}
        now = self._wall_clock()
        windows = {}
        for version in sorted(routed(found.value)):
            requests, errors, buckets = self.traffic.window(version_key(app, version), now, seconds)
            span = max(1.0, now - self.traffic.window_start(now, seconds))
            p99 = quantile(buckets, 0.99) or 0.0
            windows[version] = Window(requests, errors, p99, span)
        return windows

    def woke(self, app: str, kind: str, waited: float) -> None:
        """A request that waited `waited` seconds for the app to wake, by `thaw` or `start`."""
        self._wakes.setdefault(app, WakeTally()).add(kind, waited, self._wall_clock())

    def wakes(self, app: str) -> WakeTally | None:
        return self._wakes.get(app)

    def sample(self) -> None:
        """Each app's waiters into the ring (its slot keeps the most); apps deleted leave it."""
        now = self._wall_clock()
        for app, count in waiting_by_app(self._view, self._ledger).items():
            self.traffic.waiters(app, count, now)
        kept = set(self._view.apps)
        for found in self._view.apps.values():
            if found.value.split or found.value.tags:
                kept |= {version_key(found.value.name, v) for v in routed(found.value)}
        self.traffic.keep(kept)
        for gone in set(self._wakes) - set(self._view.apps):
            del self._wakes[gone]

    async def run(self) -> None:
        """`sample` once a second. A failure is logged, never the end of the activator."""
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("could not sample the waiters for the charts")
            await anyio.sleep(1.0)
