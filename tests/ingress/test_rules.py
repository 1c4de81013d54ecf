"""The pure decisions of the ingress, as tables of named cases."""

from __future__ import annotations

import bisect
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from wakeful.domain.leases import AppFailedToBoot, LeaseGrant, NoCapacity, Overloaded, UnknownApp
from wakeful.domain.models import App
from wakeful.domain.traffic import AppTraffic
from wakeful.ingress.cacherules import CachedLease, gives_back, heard_short, pick, plan, spares
from wakeful.ingress.errors import (
    ActivatorUnreachable,
    BadRequest,
    ConnectFailed,
    HeadersTooLarge,
    NoRoute,
    UpstreamFailed,
    UpstreamTimeout,
)
from wakeful.ingress.formats import Format, answer_for, choose_format
from wakeful.ingress.headers import (
    client_response_headers,
    new_request_id,
    upstream_request_headers,
)
from wakeful.ingress.load import IllegalMove, Load, Move, Phase, Tracker, advance
from wakeful.ingress.metrics import DURATION_BUCKETS, IngressMetrics, bucket_of
from wakeful.ingress.routing import (
    ROUTE_MEMORY,
    Router,
    build_index,
    match,
    normalize_host,
    valid_host,
)

# -- routing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        ("Hello.LocalHost:8080", "hello.localhost"),
        ("example.com.", "example.com"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("", ""),
    ],
    ids=["port and case", "trailing dot", "ipv6 with port", "ipv6 bare", "empty"],
)
def test_normalize_host(raw: str, host: str) -> None:
    assert normalize_host(raw) == host


INDEX = build_index(
    [
        App(name="shop", hosts=["shop.example.com", "*.example.com"]),
        App(name="deep", hosts=["*.eu.example.com"]),
        App(name="hello"),
        App(name="thief", hosts=["shop.example.com", "hello.localhost"]),
        App(name="quiet", hosts=["quiet.example.com"], default_host=False),
    ]
)


@pytest.mark.parametrize(
    ("host", "app"),
    [
        ("shop.example.com", "shop"),
        ("a.example.com", "shop"),
        ("x.eu.example.com", "deep"),
        ("a.b.eu.example.com", "deep"),
        ("example.com", None),
        ("hello.localhost", "hello"),  # though thief claims it as an exact host
        ("shop.localhost", "shop"),
        ("nobody.localhost", None),
        ("hello.localhost.evil.com", None),
        ("hello.other", None),
        ("quiet.localhost", None),
        ("quiet.example.com", "quiet"),
    ],
    ids=[
        "exact host",
        "wildcard",
        "longest wildcard wins",
        "wildcard spans labels",
        "wildcard needs a label",
        "app dot base domain",
        "any app dot base domain",
        "unknown app name",
        "base domain must end the host",
        "other domain",
        "an app without its default host",
        "that app by its own host",
    ],
)
def test_match(host: str, app: str | None) -> None:
    assert match(INDEX, host, "localhost") == app


@pytest.mark.parametrize(
    ("host", "valid"),
    [
        ("hello.localhost", True),
        ("Shop.Example.com:8080", True),
        ("[::1]:8080", True),
        ("192.0.2.7", True),
        ("", True),  # an HTTP/1.0 request's: no host, routed nowhere
        ("a_b.example", True),  # reg-name allows it (RFC 3986 §3.2.2)
        ("a" * 253 + ":65535", True),
        ("a" * 271, False),  # longer than any host name and port
        ("a." * 16_300 + "b", False),  # 16,000 labels: the wildcard walk's cost
        ("\xb5.example.com", False),  # latin-1 µ: case-folds to Greek mu
        ("evil.com#.example.com", False),  # would lead a redirect elsewhere
        ("evil.com/x.example.com", False),
        ("a b", False),
        ("a\tb", False),
        ("[::1", False),
        ("[::1]x", False),
        ("host:port", False),
    ],
)
def test_valid_host(host: str, valid: bool) -> None:
    assert valid_host(host) is valid


def test_a_host_claimed_twice_goes_to_the_first_app_by_name() -> None:
    assert INDEX.exact["shop.example.com"] == "shop"


def test_the_router_remembers_hosts_until_the_index_changes_and_never_one_that_is_no_host() -> None:
    index = INDEX
    router = Router(lambda: index, "localhost")
    assert router.app_for("SHOP.example.com:8080") == "shop"
    assert router.app_for("nope.example.org") is None
    assert len(router) == 2  # misses too: an unknown host costs one lookup, not one per request
    with pytest.raises(BadRequest):
        router.app_for("x" * 300 + ".example.org")
    with pytest.raises(BadRequest):
        router.app_for("\xb5.example.com")  # case-folds out of ASCII
    assert len(router) == 2  # no host (`valid_host`): refused, not kept
    for n in range(ROUTE_MEMORY + 10):  # a client inventing hosts only empties the memory
        router.app_for(f"h{n}.example.org")
    assert len(router) <= ROUTE_MEMORY
    index = build_index([App(name="shop", hosts=["other.example.com"])])
    assert router.app_for("shop.example.com") is None  # a new index: nothing remembered holds
    assert router.app_for("SHOP.example.com:8080") is None
    assert router.app_for("other.example.com") == "shop"


def test_a_split_app_gets_its_versions_evenly_and_a_tag_host_its_own_version() -> None:
    split = App(
        name="shop",
        active_version="v7",
        split={"v7": 90, "v8": 10},
        tags={"beta": "v8", "old": "v6"},
    )
    index = build_index([split, App(name="hello", active_version="v1")])
    router = Router(lambda: index, "localhost")
    picked = Counter(router.route("shop.localhost") for _ in range(1000))
    # Exactly its share: the spread is the split's, not a random walk, and the route the
    # router remembers for the host does not pin one version.
    assert picked == {("shop", "v7", True): 900, ("shop", "v8", True): 100}
    assert router.route("beta--shop.localhost") == ("shop", "v8", True)
    assert router.route("OLD--shop.localhost:80") == ("shop", "v6", True)  # at 0%: reached
    # No split, no tags: the active version, its answers counted for the app alone.
    assert router.route("hello.localhost") == ("hello", "v1", False)
    assert router.route("beta--hello.localhost") is None  # not a tag of that app
    assert router.route("beta--shop.example.com") is None  # tags live under the base domain
    assert router.route("nope--shop--x.localhost") is None
    # An app of an old name with '--' keeps its own host before any tag's reading of it.
    index = build_index([split, App(name="beta--shop", active_version="v1")])
    assert router.route("beta--shop.localhost") == ("beta--shop", "v1", False)
    index = build_index([App(name="tagged", active_version="v2", tags={"old": "v1"})])
    assert router.route("tagged.localhost") == ("tagged", "v2", True)  # tags: counted too


# -- headers -------------------------------------------------------------------------------

INCOMING = [
    ("host", "hello.localhost"),
    ("connection", "keep-alive, x-secret"),
    ("x-secret", "1"),
    ("keep-alive", "timeout=5"),
    ("te", "trailers"),
    ("transfer-encoding", "chunked"),
    ("proxy-authorization", "Basic eA=="),
    ("upgrade", "websocket"),
    ("x-forwarded-for", "10.0.0.1"),
    ("x-forwarded-proto", "https"),
    ("x-forwarded-host", "public.example.com"),
    ("x-request-id", "client-id"),
    ("accept", "*/*"),
]


@pytest.mark.parametrize(
    ("trust", "expected"),
    [
        (
            False,
            {
                "x-forwarded-for": "192.0.2.7",
                "x-forwarded-proto": "http",
                "x-forwarded-host": "hello.localhost",
            },
        ),
        (
            True,
            {
                "x-forwarded-for": "10.0.0.1, 192.0.2.7",
                "x-forwarded-proto": "https",
                "x-forwarded-host": "public.example.com",
            },
        ),
    ],
    ids=["untrusted peer: chain replaced", "trusted peer: chain appended"],
)
def test_upstream_request_headers(trust: bool, expected: dict[str, str]) -> None:
    out = upstream_request_headers(
        [(name.encode(), value.encode()) for name, value in INCOMING],
        client_ip="192.0.2.7",
        scheme="http",
        request_id="rid",
        trust_forwarded=trust,
    )
    decoded = [(name.decode(), value.decode()) for name, value in out]
    names = [name for name, _ in decoded]
    for hop in ("connection", "x-secret", "keep-alive", "te", "transfer-encoding", "upgrade"):
        assert hop not in names
    assert "proxy-authorization" not in names
    assert dict(decoded) == {"host": "hello.localhost", "accept": "*/*", "x-request-id": "rid"} | (
        expected
    )
    assert names.count("x-request-id") == 1


def test_a_header_the_connection_header_names_is_dropped_wherever_it_comes() -> None:
    raw = [(b"x-before", b"1"), (b"connection", b"X-Before, x-after"), (b"x-after", b"2")]
    out = upstream_request_headers(
        raw, client_ip="192.0.2.7", scheme="http", request_id="rid", trust_forwarded=False
    )
    assert not {b"x-before", b"x-after", b"connection"} & {name for name, _ in out}
    named_host = [(b"connection", b"host"), (b"host", b"hello.localhost")]
    out = upstream_request_headers(
        named_host, client_ip="192.0.2.7", scheme="http", request_id="r", trust_forwarded=False
    )
    assert (b"x-forwarded-host", b"hello.localhost") in out  # the host, even when named
    assert (b"host", b"hello.localhost") in out  # not the sandbox's address in its place


def test_client_response_headers() -> None:
    raw = [
        (b"Content-Type", b"text/plain"),
        (b"Connection", b"close, X-Private"),
        (b"X-Private", b"1"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Trailer", b"X-Sum"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
        (b"X-Request-Id", b"sandbox-id"),
    ]
    assert client_response_headers(raw, "rid") == [
        (b"content-type", b"text/plain"),
        (b"set-cookie", b"a=1"),
        (b"set-cookie", b"b=2"),
        (b"x-request-id", b"rid"),
    ]


# -- error answers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "fmt"),
    [
        ("application/json", Format.JSON),
        ("application/problem+json", Format.JSON),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", Format.HTML),
        ("application/json, text/html", Format.JSON),
        ("*/*", Format.TEXT),
        ("", Format.TEXT),
        ("text/plain", Format.TEXT),
    ],
    ids=["json", "json flavour", "browser", "both: json wins", "curl", "none", "text"],
)
def test_choose_format(accept: str, fmt: Format) -> None:
    assert choose_format(accept) is fmt


@pytest.mark.parametrize(
    ("exc", "status", "error", "retry_after"),
    [
        (NoRoute("x.localhost"), 404, "unknown host", None),
        (UnknownApp("no app"), 404, "unknown app", None),
        (HeadersTooLarge("big"), 431, "request header fields too large", None),
        (NoCapacity("slow", 7), 503, "no capacity", 7),
        (Overloaded("full", 5), 503, "no capacity", 5),
        (AppFailedToBoot("crash", 30, "log"), 503, "app failed to boot", 30),
        (ActivatorUnreachable("down"), 503, "activator unavailable", 5),
        (ConnectFailed("refused"), 502, "upstream failed", None),
        (UpstreamFailed("reset"), 502, "upstream failed", None),
        (UpstreamTimeout("quiet"), 504, "upstream timed out", None),
        (RuntimeError("bug"), 500, "internal error", None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None,
)
def test_answer_for(exc: Exception, status: int, error: str, retry_after: int | None) -> None:
    answer = answer_for(exc)
    assert (answer.status, answer.error, answer.retry_after) == (status, error, retry_after)


# -- the lease cache -----------------------------------------------------------------------


def lease(
    sandbox: str, size: int, uses: int, *, overflow: bool = False, **kw: float
) -> CachedLease:
    grant = LeaseGrant(
        lease_id=f"{sandbox}-{size}-{uses}",
        sandbox_id=sandbox,
        url="http://127.0.0.1:1",
        size=size,
        overflow=overflow,
        ttl_seconds=kw.get("ttl", 60.0),
    )
    return CachedLease(
        grant,
        ("hello", None),
        renewed_at=kw.get("renewed_at", 0.0),
        idle_since=kw.get("idle_since", 0.0),
        uses=uses,
        used=bool(kw.get("used", False)),
    )


@pytest.mark.parametrize(
    ("entries", "avoid", "chosen"),
    [
        ([], (), None),
        ([lease("a", 2, 2)], (), None),
        ([lease("a", 2, 1)], (), 0),
        ([lease("a", 3, 2), lease("b", 3, 1)], (), 1),
        ([lease("a", 3, 1), lease("b", 3, 1)], (), 0),
        ([lease("a", 1, 0, overflow=True)], (), None),
        ([lease("a", 2, 0), lease("b", 2, 1)], ("a",), 1),
        ([lease("a", 5, 1), lease("a", 5, 3)], (), 1),
        ([lease("a", 5, 0), lease("a", 5, 5), lease("a", 5, 2)], (), 2),
        ([lease("a", 5, 1), lease("a", 5, 3), lease("b", 5, 3)], (), 2),
        ([lease("a", 5, 1), lease("a", 5, 1), lease("b", 5, 3)], (), 0),
        ([lease("a", 2, 2)], ("a",), None),
        ([lease("a", 2, 0, overflow=True), lease("b", 2, 1)], (), 1),
    ],
    ids=[
        "empty cache",
        "size 2 with 2 uses is full",
        "room left",
        "fewest uses wins",
        "first wins a tie",
        "overflow never carries another",
        "a refused sandbox is skipped",
        "on one sandbox the busiest lease with room (its others go idle)",
        "on one sandbox, a full lease skipped for the next busiest",
        "the sandbox with fewer requests, then its busiest lease",
        "on the lighter sandbox, a tie between its leases: the first",
        "a full lease on a refused sandbox",
        "an overflow lease beside a normal one",
    ],
)
def test_pick(entries: list[CachedLease], avoid: tuple[str, ...], chosen: int | None) -> None:
    found = pick(entries, avoid)
    assert found is (None if chosen is None else entries[chosen])


@pytest.mark.parametrize(
    ("entry", "now", "action"),
    [
        (lease("a", 2, 0, idle_since=0, renewed_at=0), 31, "release"),
        (lease("a", 2, 0, idle_since=10, renewed_at=25), 31, None),
        (lease("a", 2, 1, idle_since=0, renewed_at=0), 31, "renew"),
        (lease("a", 2, 1, idle_since=0, renewed_at=18), 19, None),
        (lease("a", 2, 0, idle_since=5, renewed_at=0, ttl=30), 11, "renew"),
        (lease("a", 2, 1, idle_since=0, renewed_at=0, used=True), 6, "renew"),
        (lease("a", 2, 1, idle_since=0, renewed_at=0, used=True), 4, None),
        (lease("a", 2, 0, idle_since=4, renewed_at=0), 6, None),
        (lease("a", 2, 1, idle_since=0, renewed_at=0), 6, "renew"),
    ],
    ids=[
        "idle past the ttl goes back",
        "idle but not long enough",
        "busy past a third of its ttl is renewed",
        "busy, reported within the last 2 s",
        "idle and due is renewed until it has idled enough",
        "traffic since the last renew is reported after 5 s",
        "traffic is not reported more often than that",
        "no traffic, nothing to report before a third of the ttl",
        "a request still running is reported like new traffic",
    ],
)
def test_plan(entry: CachedLease, now: float, action: str | None) -> None:
    todo = plan([entry], now, idle_ttl=30)
    got = "release" if todo.release else "renew" if todo.renew else None
    assert got == action


def evicted(entry: CachedLease) -> CachedLease:
    entry.cached = False
    return entry


@pytest.mark.parametrize(
    ("entries", "now", "handed_back"),
    [
        ([lease("a", 20, 0, idle_since=10)], 11, [0]),
        ([lease("a", 20, 0, idle_since=10)], 10.5, []),
        ([lease("a", 20, 1, idle_since=0)], 60, []),
        ([evicted(lease("a", 20, 0, idle_since=0))], 60, []),
        ([lease("a", 20, 3), lease("a", 20, 0, idle_since=2), lease("b", 20, 0)], 5, [1, 2]),
    ],
    ids=[
        "idle for a second goes back",
        "idle for less stays (between two requests of a steady load)",
        "one carrying a request stays, however long",
        "one out of the cache already is not released twice",
        "the busy one stays, every quiet one goes, on any sandbox",
    ],
)
def test_spares(entries: list[CachedLease], now: float, handed_back: list[int]) -> None:
    assert spares(entries, now) == [entries[i] for i in handed_back]


@pytest.mark.parametrize(
    ("overflowed_at", "waiting", "now", "expected"),
    [
        (None, False, 100.0, True),
        (95.0, False, 100.0, False),
        (85.0, False, 100.0, True),
        (None, True, 100.0, False),
    ],
    ids=[
        "short elsewhere: hand back",
        "an overflow lease here moments ago: the shortness may be this ingress's own",
        "that overflow long past: hand back",
        "requests of the key wait here: keep",
    ],
)
def test_gives_back(overflowed_at: float | None, waiting: bool, now: float, expected: bool) -> None:
    assert gives_back(overflowed_at, waiting, now) is expected


def on(version: str, app: str = "hello") -> CachedLease:
    grant = LeaseGrant(
        lease_id=f"{app}-{version}", sandbox_id="a", url="http://127.0.0.1:1", size=2,
        overflow=False, ttl_seconds=60.0, version=version,
    )  # fmt: skip
    return CachedLease(grant, (app, None), renewed_at=0.0, idle_since=0.0)


@pytest.mark.parametrize(
    ("entries", "told", "now", "short_now"),
    [
        ([on("v1")], {("hello", "v1"): 100.0}, 100.0, {(("hello", None), "v1")}),
        ([on("v1")], {("hello", "v1"): 100.0}, 109.9, {(("hello", None), "v1")}),
        ([on("v1")], {("hello", "v1"): 100.0}, 110.0, set()),
        ([on("v1"), on("v2")], {("hello", "v2"): 100.0}, 101.0, {(("hello", None), "v2")}),
        ([on("v1", "other")], {("hello", "v1"): 100.0}, 101.0, set()),
        ([on("v1")], {}, 101.0, set()),
    ],
    ids=[
        "told now",
        "told within the spell",
        "told a spell ago: no more",
        "a key holding two versions: the one told",
        "another app's",
        "never told",
    ],
)
def test_heard_short(
    entries: list[CachedLease],
    told: dict[tuple[str, str], float],
    now: float,
    short_now: set[tuple[tuple[str, str | None], str]],
) -> None:
    assert heard_short(entries, told, now) == short_now


# -- request tracking ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moves", "phase", "queued", "in_flight"),
    [
        ([Move.WAIT], Phase.QUEUED, 1, 0),
        ([Move.WAIT, Move.HOLD], Phase.PROXYING, 0, 1),
        ([Move.HOLD, Move.HOLD], Phase.PROXYING, 0, 1),
        ([Move.HOLD, Move.WAIT, Move.HOLD], Phase.PROXYING, 0, 1),
        ([Move.WAIT, Move.FINISH], Phase.DONE, 0, 0),
        ([Move.HOLD, Move.FINISH, Move.FINISH], Phase.DONE, 0, 0),
    ],
    ids=[
        "waiting is queued",
        "holding capacity is in flight",
        "holding twice counts once",
        "a retry counts once",
        "finishing a wait",
        "finishing twice",
    ],
)
def test_tracker(moves: list[Move], phase: Phase, queued: int, in_flight: int) -> None:
    registry = CollectorRegistry()
    tracker = IngressMetrics(registry).tracker("hello")
    for move in moves:
        tracker.move(move)
    assert tracker.phase is phase
    labels = {"app": "hello"}
    assert registry.get_sample_value("wakeful_ingress_requests_queued", labels) == queued
    assert registry.get_sample_value("wakeful_ingress_requests_in_flight", labels) == in_flight


@pytest.mark.parametrize("move", [Move.WAIT, Move.HOLD])
def test_nothing_moves_out_of_done_but_finish(move: Move) -> None:
    with pytest.raises(IllegalMove):
        advance(Phase.DONE, move)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("move", [Move.HOLD, Move.FINISH])
def test_hold_and_finish_move_as_the_table_says(phase: Phase, move: Move) -> None:
    """`Tracker.hold` and `finish`, the moves every request makes, skip the table's lookup:
    from every phase they do what `move` does (or raise as it does)."""

    def run(fast: bool) -> tuple[Phase, int, int] | type[Exception]:
        load = Load()
        load.queued = load.in_flight = 1  # as if this request were counted in its phase
        tracker = Tracker(load)
        tracker.phase = phase
        try:
            if fast:
                tracker.hold() if move is Move.HOLD else tracker.finish()
            else:
                tracker.move(move)
        except IllegalMove:
            return IllegalMove
        return tracker.phase, load.queued, load.in_flight

    assert run(fast=True) == run(fast=False)


def test_request_ids_are_32_hex_digits_and_never_repeat_across_refills() -> None:
    """Read from the CSPRNG 4 KiB at a time: ids made across several refills stay distinct."""
    ids = [new_request_id() for _ in range(2000)]  # ~8 refills
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_each_version_s_answers_go_in_the_next_report_and_only_in_it() -> None:
    """Issue 39: the report carries each version's answers since the last report, beside
    the app's, their durations the sandbox's (the upstream phase: a wait for a lease or a wake
    is not the version's); a version past the bound of a report is left out, the app still
    counted."""
    metrics = IngressMetrics(CollectorRegistry())
    for status, version in ((200, "v1"), (200, "v1"), (503, "v2"), (200, None)):
        if status == 200:
            metrics.phases("web", 2.0, 1.5, 0.003, version)  # waited 2 s, 3 ms upstream
        metrics.answered("web", status, 2.003, version)
    report = metrics.traffic_since_last()["web"]
    assert (report.requests, report.errors) == (4, 1)
    assert {v: (c.requests, c.errors) for v, c in report.versions.items()} == {
        "v1": (2, 0),
        "v2": (1, 1),
    }
    assert report.versions["v1"].buckets[2] == 2 == sum(report.versions["v1"].buckets)  # 2.5-5 ms
    assert sum(report.versions["v2"].buckets) == 0  # it never reached a sandbox
    metrics.answered("web", 200, 0.003, "v2")
    assert {v: c.requests for v, c in metrics.traffic_since_last()["web"].versions.items()} == {
        "v2": 1
    }
    for n in range(70):
        metrics.answered("web", 200, 0.003, f"v{n}")
    report = metrics.traffic_since_last()["web"]
    assert report.requests == 70 and len(report.versions) == 64
    AppTraffic.model_validate(report.model_dump())  # what the activator takes


def test_answers_are_counted_by_class_and_duration_as_prometheus_would() -> None:
    """Plain counts behind the request metrics: a bucket holds what is at most its bound."""
    registry = CollectorRegistry()
    metrics = IngressMetrics(registry)
    for status, seconds in ((200, 0.001), (204, 0.0011), (499, 3.0), (502, 45.0)):
        metrics.answered("hello", status, seconds)
    metrics.cache_hit("hello")
    metrics.cache_miss("hello")
    metrics.cache_miss("hello")

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"wakeful_ingress_{name}", {"app": "hello", **labels})

    assert sample("requests_total", status_class="2xx") == 2
    assert sample("requests_total", status_class="4xx") == 1
    assert sample("requests_total", status_class="5xx") == 1
    assert sample("requests_total", status_class="3xx") is None  # no series before its first
    buckets = {"0.001": 1, "0.0025": 2, "2.5": 2, "5.0": 3, "30.0": 3, "+Inf": 4}
    for bound, count in buckets.items():
        assert sample("request_duration_seconds_bucket", le=bound) == count, bound
    assert sample("request_duration_seconds_count") == 4
    assert sample("request_duration_seconds_sum") == pytest.approx(0.001 + 0.0011 + 3 + 45)
    assert sample("lease_cache_hits_total") == 1
    assert sample("lease_cache_misses_total") == 2
    assert registry.get_sample_value("wakeful_ingress_requests_total", {"app": "other"}) is None


def test_a_duration_s_bucket_is_the_one_bisect_finds() -> None:
    """`bucket_of`, the compiled loop every answer runs, agrees with `bisect_left` over the
    bounds: on each bound (a bucket holds what is at most its bound), either side of it, and
    past the last."""
    durations = [-1.0, 0.0, 1e-9, 45.0, float("inf")]
    for bound in DURATION_BUCKETS:
        durations += [bound * 0.999, bound, bound * 1.001]
    for seconds in durations:
        assert bucket_of(seconds) == bisect.bisect_left(DURATION_BUCKETS, seconds), seconds
