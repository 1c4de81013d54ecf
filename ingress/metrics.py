"""The ingress's metrics: what it shows Prometheus, and the traffic it reports to the
activator. The load gauges read each app's `ingress.load.Load`, which every request's
`Tracker` keeps honest (seed 001)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Final

import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from wakeful.domain.grpcstatus import code_name
from wakeful.domain.traffic import (
    BOUNDS,
    MAX_VERSIONS_PER_REPORT,
    AppTraffic,
    Counted,
    TrafficReport,
)
from wakeful.ingress.load import Load, Tracker

DURATION_BUCKETS: Final = BOUNDS
"""The activator merges the ingresses' counts in these buckets (`wakeful.domain.traffic`)."""
_BOUNDS: Final = tuple(float(bound) for bound in BOUNDS)


def bucket_of(seconds: float) -> int:
    """The first bucket `seconds` fits (as `bisect_left` over `DURATION_BUCKETS` says). A
    loop from the smallest, compiled: most requests fit the first buckets, and a call of
    `bisect` itself goes through the interpreter and compares boxed floats (twice the
    time)."""
    at = 0
    for bound in _BOUNDS:
        if seconds <= bound:
            return at
        at += 1
    return at


PHASES: Final = ("queue", "wake", "upstream")
"""What a proxied request's time went on, as `Server-Timing` names them: waiting for a lease,
of which waiting for its app to wake (only a request that woke it), and the sandbox's time
to the answer's head."""


class IngressMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._counts: dict[str, AppCounts] = {}
        """Per app, what every request moves: plain ints, read by `_Counts` when scraped."""
        registry.register(_Counts(self._counts))
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
        self.connect_retries = Counter(
            "wakeful_ingress_connect_retries",
            "Retries on another sandbox after nothing reached the first",
            ["app"],
            registry=registry,
        )
        self.websockets = Gauge(
            "wakeful_ingress_websockets_open",
            "WebSockets open (each also counts as a request in flight)",
            ["app"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "wakeful_ingress_upstream_errors",
            "Upstream failures by kind: connect, failed, timeout",
            ["app", "kind"],
            registry=registry,
        )
        self.http2_open = Gauge(
            "wakeful_ingress_http2_connections_open",
            "Client connections speaking HTTP/2 (each of their streams is a request)",
            registry=registry,
        )
        self.http2_cut_off = Counter(
            "wakeful_ingress_http2_connections_cut_off",
            "HTTP/2 connections ended for what their client did (GOAWAY), by reason: "
            "protocol, header-block, slow-header-block, control-frames, resets",
            ["reason"],
            registry=registry,
        )

        self.refused = Counter(
            "wakeful_ingress_connections_refused",
            "Client connections refused or closed for what their client did (HTTP/2's: "
            "http2_connections_cut_off), by reason: connections (past the bound), "
            "tls-handshake, plain-http (on the TLS port), malformed, head-too-large, slow-head, "
            "framing",
            ["reason"],
            registry=registry,
        )

        self._loads: dict[str, Load] = {}
        self._reported: dict[str, tuple[int, int, list[int]]] = {}
        """Per app, its counts at the last `traffic_since_last`."""

    def counts(self, app: str) -> AppCounts:
        """`app`'s counts, made on first use (a series appears with its first request)."""
        counts = self._counts.get(app)
        if counts is None:
            counts = self._counts[app] = AppCounts()
        return counts

    def tracker(self, app: str) -> Tracker:
        load = self._loads.get(app)
        if load is None:
            load = self._loads[app] = Load()
            # The gauges read the counts when scraped: a request moves plain ints, no lock.
            self.in_flight.labels(app=app).set_function(lambda: load.in_flight)
            self.queued.labels(app=app).set_function(lambda: load.queued)
        return Tracker(load)

    def answered(self, app: str, status: int, seconds: float, version: str | None = None) -> None:
        """Count one finished request by status class, and how long it took; and for the
        version it was for, until the next report (`traffic_since_last`), the request and
        whether it was a 5xx (its duration is the sandbox's: `phases`)."""
        counts = self._counts.get(app) or self.counts(app)
        counts.classes[status // 100] += 1
        counts.buckets[bucket_of(seconds)] += 1
        counts.seconds += seconds
        if version is not None:
            of = counts.versions.get(version) or counts.new_version(version)
            if of is not None:
                of.requests += 1
                if status >= 500:
                    of.errors += 1

    def called(self, app: str, code: int) -> None:
        """Count one finished gRPC call by the code it ended with (`grpc.call_code`)."""
        calls = (self._counts.get(app) or self.counts(app)).calls
        calls[code] = calls.get(code, 0) + 1

    @contextlib.contextmanager
    def websocket(self, app: str) -> Iterator[None]:
        """Counts one open WebSocket of `app` while the block runs."""
        gauge = self.websockets.labels(app=app)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def phases(
        self, app: str, queue: float, wake: float, upstream: float, version: str | None = None
    ) -> None:
        """One proxied request's phases (`AppCounts.phases`)."""
        (self._counts.get(app) or self.counts(app)).phases(queue, wake, upstream, version)

    def traffic_since_last(self) -> TrafficReport:
        """What each app answered since the last call: the ingress's report to the activator
        (`Leases.report`), made of the counts the metrics keep anyway."""
        report: TrafficReport = {}
        for app, counts in list(self._counts.items()):
            if app == "-":  # unrouted: no app to chart
                continue
            total = sum(counts.classes)
            sent = self._reported.get(app)
            if sent is not None and sent[0] == total:
                continue  # nothing since: no copy, no report
            now = (total, counts.classes[5], list(counts.buckets))
            self._reported[app] = now
            if sent is None:
                sent = (0, 0, [0] * len(now[2]))
            buckets = [a - b for a, b in zip(now[2], sent[2], strict=True)]
            versions = {
                version: Counted.model_construct(
                    requests=of.requests, errors=of.errors, buckets=of.buckets
                )
                for version, of in counts.versions.items()
            }
            counts.versions = {}
            report[app] = AppTraffic.model_construct(  # our own counts: nothing to validate
                requests=total - sent[0],
                errors=now[1] - sent[1],
                buckets=buckets,
                versions=versions,
            )
        return report

    def cache_hit(self, app: str) -> None:
        (self._counts.get(app) or self.counts(app)).hits += 1

    def cache_miss(self, app: str) -> None:
        (self._counts.get(app) or self.counts(app)).misses += 1


class VersionCounts:
    """One version's answers since the last report (`IngressMetrics.traffic_since_last`)."""

    __slots__ = ("buckets", "errors", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)


class AppCounts:
    """An app's request counts. Every request adds to these, so they are plain ints rather
    than prometheus_client children (which validate and lock on every call, ~1 µs each)."""

    __slots__ = (
        "buckets",
        "calls",
        "classes",
        "created",
        "direct",
        "hits",
        "misses",
        "phase_buckets",
        "queue_seconds",
        "seconds",
        "upstream_seconds",
        "versions",
        "wake_seconds",
    )

    def __init__(self) -> None:
        self.created = time.time()
        """Every series of the app counts from here (its `_created`, as prometheus_client
        reports for its own counters)."""
        self.classes = [0] * 6
        """Answers by status // 100 (1xx..5xx; 499, a client gone, is a 4xx)."""
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)
        """Answers by the first duration bucket they fit (the last: over every bound)."""
        self.seconds = 0.0
        self.hits = 0
        self.direct = 0
        """Requests answered by the direct path (`ingress.direct`)."""
        self.misses = 0
        self.calls: dict[int, int] = {}
        """gRPC calls by the code they ended with."""
        self.phase_buckets = [[0] * (len(DURATION_BUCKETS) + 1) for _ in PHASES]
        """Per phase (`PHASES`), like `buckets`."""
        self.queue_seconds = 0.0
        self.wake_seconds = 0.0
        self.upstream_seconds = 0.0
        """Per phase, like `seconds` (attributes, not a list: compiled, a float attribute is
        not a Python object to make at every request)."""
        self.versions: dict[str, VersionCounts] = {}
        """Per version the requests named, since the last report."""

    def new_version(self, version: str) -> VersionCounts | None:
        """`version`'s counts, new in this report, or None past the bound of one."""
        if len(self.versions) >= MAX_VERSIONS_PER_REPORT:
            return None  # more than any app routes at once: left out of this report
        of = self.versions[version] = VersionCounts()
        return of

    def phases(
        self, queue: float, wake: float, upstream: float, version: str | None = None
    ) -> None:
        """One proxied request's phases (`PHASES`); `wake` only when it woke its app. The
        upstream phase (the sandbox's time to the answer's head) is also the version's
        duration: what a ramp's verdict compares, so that a wait for a lease, a wake or a
        new leader is never read as a slower version."""
        buckets = self.phase_buckets
        buckets[0][bucket_of(queue)] += 1
        bucket = bucket_of(upstream)
        buckets[2][bucket] += 1
        if version is not None:
            of = self.versions.get(version) or self.new_version(version)
            if of is not None:
                of.buckets[bucket] += 1
        self.queue_seconds += queue
        self.upstream_seconds += upstream
        if wake:
            buckets[1][bucket_of(wake)] += 1
            self.wake_seconds += wake

    @property
    def phase_seconds(self) -> tuple[float, float, float]:
        """The seconds of each phase (`PHASES`), in its order."""
        return (self.queue_seconds, self.wake_seconds, self.upstream_seconds)


class _Counts(Collector):
    """`AppCounts` as the metrics they always were."""

    def __init__(self, counts: dict[str, AppCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "wakeful_ingress_requests",
            "Requests answered, by app and status class (2xx..5xx); app '-' when unrouted",
            labels=["app", "status_class"],
        )
        duration = HistogramMetricFamily(
            "wakeful_ingress_request_duration_seconds",
            "Time from request to the end of the answer",
            labels=["app"],
        )
        hits = CounterMetricFamily(
            "wakeful_ingress_lease_cache_hits",
            "Requests carried by a cached lease",
            labels=["app"],
        )
        direct = CounterMetricFamily(
            "wakeful_ingress_direct_requests",
            "Requests answered in callbacks, without a task (the direct path: no body, a cached "
            "lease with room, an idle upstream connection); the rest, and a resend after the "
            "keep-alive race, go the general path",
            labels=["app"],
        )
        misses = CounterMetricFamily(
            "wakeful_ingress_lease_cache_misses",
            "Requests that asked the activator for a lease",
            labels=["app"],
        )
        phases = HistogramMetricFamily(
            "wakeful_ingress_request_phase_seconds",
            "Proxied requests' time by phase: queue (waiting for a lease), wake (of which "
            "waiting for the app to wake; only requests that woke it), upstream (the "
            "sandbox's time to the answer's head)",
            labels=["app", "phase"],
        )
        calls = CounterMetricFamily(
            "wakeful_ingress_grpc_calls",
            "gRPC calls answered, by app and the code they ended with (OK, UNAVAILABLE...; "
            "an unnamed code as its number; CANCELLED: the client left); app '-' when unrouted",
            labels=["app", "code"],
        )
        created = prometheus_client.metrics._use_created  # its PROMETHEUS_DISABLE_CREATED_SERIES
        for app, counts in list(self._counts.items()):
            since = counts.created if created else None
            for klass, n in enumerate(counts.classes):
                if n:
                    requests.add_metric([app, f"{klass}xx"], n, created=since)
            if any(counts.buckets):
                duration.add_metric([app], _cumulative(counts.buckets), counts.seconds)
                if since is not None:
                    name = f"{duration.name}_created"
                    duration.samples.append(Sample(name, {"app": app}, since))
            for phase, buckets, seconds in zip(
                PHASES, counts.phase_buckets, counts.phase_seconds, strict=True
            ):
                if any(buckets):
                    phases.add_metric([app, phase], _cumulative(buckets), seconds)
                    if since is not None:
                        name = f"{phases.name}_created"
                        phases.samples.append(Sample(name, {"app": app, "phase": phase}, since))
            if counts.hits:
                hits.add_metric([app], counts.hits, created=since)
            if counts.direct:
                direct.add_metric([app], counts.direct, created=since)
            if counts.misses:
                misses.add_metric([app], counts.misses, created=since)
            for code, n in sorted(counts.calls.items()):
                calls.add_metric([app, code_name(code)], n, created=since)
        yield from (requests, duration, phases, hits, direct, misses, calls)


def _cumulative(buckets: list[int]) -> list[tuple[str, float]]:
    """Counts per bucket as a histogram's cumulative `le` samples."""
    cumulative: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(DURATION_BUCKETS, buckets, strict=False):
        total += n
        cumulative.append((_bound(bound), total))
    cumulative.append(("+Inf", total + buckets[-1]))
    return cumulative


def _bound(value: float) -> str:
    return repr(float(value))  # as prometheus_client writes `le` ("0.001", "1.0", "30.0")
