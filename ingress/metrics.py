"""The ingress's metrics, and the per-request tracker that keeps the load gauges honest.

Seed 001: `requests_in_flight` counts only requests being proxied to a sandbox (holding
capacity); a request waiting for capacity is in `requests_queued` instead. Each request owns a
`Tracker` whose phase changes follow one table; repeating a move is a no-op, so a retry
that holds capacity again never counts the request twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Phase(StrEnum):
    NEW = "new"
    QUEUED = "queued"
    PROXYING = "proxying"
    DONE = "done"


class Move(StrEnum):
    WAIT = "wait"
    """Waiting for the activator to grant capacity."""
    HOLD = "hold"
    """Holds capacity: about to be, or being, proxied."""
    FINISH = "finish"


TRANSITIONS: dict[tuple[Phase, Move], Phase] = {
    (Phase.NEW, Move.WAIT): Phase.QUEUED,
    (Phase.NEW, Move.HOLD): Phase.PROXYING,
    (Phase.NEW, Move.FINISH): Phase.DONE,
    (Phase.QUEUED, Move.WAIT): Phase.QUEUED,
    (Phase.QUEUED, Move.HOLD): Phase.PROXYING,
    (Phase.QUEUED, Move.FINISH): Phase.DONE,
    (Phase.PROXYING, Move.WAIT): Phase.PROXYING,
    (Phase.PROXYING, Move.HOLD): Phase.PROXYING,
    (Phase.PROXYING, Move.FINISH): Phase.DONE,
    (Phase.DONE, Move.FINISH): Phase.DONE,
}
"""A retry asks for capacity again while it still holds the lease it failed on (kept until the
request ends, so the activator steers the retry elsewhere): it stays PROXYING, counted once.
Nothing moves out of DONE but FINISH."""


class IllegalMove(RuntimeError):
    pass


def advance(phase: Phase, move: Move) -> Phase:
    try:
        return TRANSITIONS[(phase, move)]
    except KeyError:
        raise IllegalMove(f"a request in phase {phase} cannot {move}") from None


class IngressMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "wakeful_ingress_requests",
            "Requests answered, by app and status class (2xx..5xx); app '-' when unrouted",
            ["app", "status_class"],
            registry=registry,
        )
        self.duration = Histogram(
            "wakeful_ingress_request_duration_seconds",
            "Time from request to the end of the answer",
            ["app"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.in_flight = Gauge(
            "wakeful_ingress_requests_in_flight",
            "Requests being proxied to a sandbox (holding capacity); waiting ones excluded",
            ["app"],
            registry=registry,
        )
        self.queued = Gauge(
            "wakeful_ingress_requests_queued",
            "Requests waiting for the activator to grant capacity",
            ["app"],
            registry=registry,
        )
        self.cache_hits = Counter(
            "wakeful_ingress_lease_cache_hits",
            "Requests carried by a cached lease",
            ["app"],
            registry=registry,
        )
        self.cache_misses = Counter(
            "wakeful_ingress_lease_cache_misses",
            "Requests that asked the activator for a lease",
            ["app"],
            registry=registry,
        )
        self.connect_retries = Counter(
            "wakeful_ingress_connect_retries",
            "Retries on another sandbox after nothing reached the first",
            ["app"],
            registry=registry,
        )
        self.websockets = Gauge(
            "wakeful_ingress_websockets_open",
            "WebSocket tunnels open (each also counts as a request in flight)",
            ["app"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "wakeful_ingress_upstream_errors",
            "Upstream failures by kind: connect, failed, timeout",
            ["app", "kind"],
            registry=registry,
        )

        # labels() validates, sorts and locks on every call (a few microseconds); the hot path
        # reuses each labelled child instead. Children are still made on first use, so a
        # series appears exactly when it would with labels() at every call site.
        self._loads: dict[str, Load] = {}
        self._answered: dict[tuple[str, int], Counter] = {}
        self._durations: dict[str, Histogram] = {}
        self._hits: dict[str, Counter] = {}
        self._misses: dict[str, Counter] = {}

    def tracker(self, app: str) -> Tracker:
        load = self._loads.get(app)
        if load is None:
            load = self._loads[app] = Load()
            # The gauges read the counts when scraped: a request moves plain ints, no lock.
            self.in_flight.labels(app=app).set_function(lambda: load.in_flight)
            self.queued.labels(app=app).set_function(lambda: load.queued)
        return Tracker(load)

    def answered(self, app: str, status: int, seconds: float) -> None:
        """Count one finished request by status class, and how long it took."""
        counter = self._answered.get((app, status))
        if counter is None:
            counter = self.requests.labels(app=app, status_class=f"{status // 100}xx")
            self._answered[(app, status)] = counter
        counter.inc()
        duration = self._durations.get(app)
        if duration is None:
            duration = self._durations[app] = self.duration.labels(app=app)
        duration.observe(seconds)

    @contextlib.contextmanager
    def websocket(self, app: str) -> Iterator[None]:
        """Counts one open WebSocket tunnel of `app` while the block runs."""
        gauge = self.websockets.labels(app=app)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def cache_hit(self, app: str) -> None:
        counter = self._hits.get(app)
        if counter is None:
            counter = self._hits[app] = self.cache_hits.labels(app=app)
        counter.inc()

    def cache_miss(self, app: str) -> None:
        counter = self._misses.get(app)
        if counter is None:
            counter = self._misses[app] = self.cache_misses.labels(app=app)
        counter.inc()


class Load:
    """An app's requests in each counted phase, as its gauges report them."""

    __slots__ = ("in_flight", "queued")

    def __init__(self) -> None:
        self.in_flight = 0
        self.queued = 0


class Tracker:
    """One request's place in the load gauges."""

    __slots__ = ("_load", "phase")

    def __init__(self, load: Load) -> None:
        self._load = load
        self.phase = Phase.NEW

    def move(self, move: Move) -> None:
        before = self.phase
        after = advance(before, move)
        if after is before:
            return
        load = self._load
        if before is Phase.QUEUED:
            load.queued -= 1
        elif before is Phase.PROXYING:
            load.in_flight -= 1
        if after is Phase.QUEUED:
            load.queued += 1
        elif after is Phase.PROXYING:
            load.in_flight += 1
        self.phase = after
