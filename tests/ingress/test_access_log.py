"""The ingress's access log (issue 40): a line per proxied request of the apps that ask (or of
every app, with WAKEFUL_ACCESS_LOG), what each line holds, the query string left out unless
the app keeps it, sampling past the rate with what each kept line stands for, and a bound on
what waits when the activator is out of reach. The lines reach the activator's sink with the
traffic reports."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.support.ingress import stack
from wakeful.domain.leases import LeaseGrant
from wakeful.domain.models import AppSpec, Concurrency
from wakeful.ingress.accesslog import AccessLog
from wakeful.ingress.cacherules import CachedLease

pytestmark = pytest.mark.anyio
SPEC = AppSpec(command=["serve"], concurrency=Concurrency(requests_per_instance=5))


async def test_an_app_that_asks_gets_a_line_per_request_with_what_happened(
    hello: Callable[[], int],
) -> None:
    asking = {"spec": SPEC.model_copy(update={"access_log": True})}
    async with stack({"sb-1": hello()}, pool_update=asking) as s:
        first = await s.client.get("/a%20b?token=secret", headers={"x-request-id": "req-1"})
        posted = await s.client.post("/form", content=b"x" * 10)
        lines = s.ingress.access.take()
    assert first.status_code == 200 and posted.status_code == 200
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("GET", "/a%20b", 200),  # no query string: it can carry tokens
        ("POST", "/form", 200),
    ]
    line = lines[0]
    assert (line["app"], line["version"], line["sandbox"], line["id"]) == (
        "hello",
        "v1",
        "sb-1",
        "req-1",
    )
    assert line["bytes"] == len(first.content) and line["sample"] == 1
    assert isinstance(line["ms"], float) and line["ms"] > 0
    assert lines[1]["id"] == posted.headers["x-request-id"]


async def test_an_app_that_does_not_ask_gets_none_unless_the_ingress_logs_every_app(
    hello: Callable[[], int],
) -> None:
    async with stack({"sb-1": hello()}) as s:
        await s.client.get("/")
        assert s.ingress.access.take() == []
    keeping = {"spec": SPEC.model_copy(update={"access_log_query": True})}
    async with stack({"sb-1": hello()}, pool_update=keeping, access_log=True) as s:
        await s.client.get("/q?page=2")
        await s.client.get("/", headers={"host": "nobody.localhost"})  # no app: no app's log
        assert [line["path"] for line in s.ingress.access.take()] == ["/q?page=2"]


async def test_the_lines_go_to_the_activator_with_the_traffic_report(
    hello: Callable[[], int],
) -> None:
    got: list[tuple[str, list[dict[str, object]]]] = []
    async with stack({"sb-1": hello()}, access_log=True, traffic_report_interval=0.05) as s:
        s.activator.access_sink = lambda ingress, lines: got.append((ingress, lines))
        await s.client.get("/shipped")
        with anyio.fail_after(10):
            while not got:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert got[0][0] == s.ingress.name and s.ingress.name
        assert [line["path"] for line in got[0][1]] == ["/shipped"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def record(log: AccessLog, path: str = "/") -> None:
    """One request's end, as the edge does it: a line made only when the sample keeps it."""
    if sample := log.sample():
        log.record(
            "hello", "v1", "sb-1", "GET", path.encode(), 200, 2, 0.001, "", "r", False, sample
        )


def test_past_its_rate_the_log_samples_and_each_line_says_for_how_many() -> None:
    clock = Clock()
    log = AccessLog(True, 10, CollectorRegistry(), clock=clock)
    for _ in range(10):
        record(log)
    clock.now += 1
    for _ in range(40):  # the second before held 10: now 40, kept 1 in 2 past the first 10
        record(log)
    clock.now += 1
    for _ in range(40):  # sized from the second before: 1 in 4
        record(log)
    lines = log.take()
    samples = [line["sample"] for line in lines]
    assert samples == [1] * 20 + [2] * 10 + [4] * 10
    # Past twice the rate the second's last 10 requests went unrepresented: 5 lines capped.
    assert sum(samples) == 10 + 30 + 40
    assert log.counts["capped"] == 5
    assert (log.counts["kept"], log.counts["sampled"]) == (40, 90 - 40 - 5)  # each counted once


def test_lines_that_cannot_go_wait_within_their_bound_the_oldest_going_first() -> None:
    clock = Clock()
    log = AccessLog(True, 1000, CollectorRegistry(), max_held=5, clock=clock)
    for i in range(4):
        record(log, f"/{i}")
    lines = log.take()
    for i in range(4, 7):
        record(log, f"/{i}")
    log.keep(lines)  # the channel was down: back before the newer ones, within the bound
    assert [line["path"] for line in log.take()] == ["/2", "/3", "/4", "/5", "/6"]
    assert log.counts["overflowed"] == 2


def test_a_request_that_got_no_lease_is_logged_as_the_app_s_last_lease_said() -> None:
    """A 503 while the app woke, a 502: no lease carried the request, yet an app that asks
    for its access log wants those lines most."""
    log = AccessLog(False, 1000, CollectorRegistry())
    asking = LeaseGrant(
        lease_id="l",
        sandbox_id="sb-1",
        url="http://x",
        size=1,
        overflow=False,
        ttl_seconds=60,
        access_log=True,
        access_log_query=True,
    )

    def said(grant: LeaseGrant) -> tuple[bool, bool]:  # what the edge passes: its lease's
        return CachedLease(grant, ("hello", None), renewed_at=0.0, idle_since=0.0).log

    assert log.wants("hello", None) == (False, False)  # never leased here: not known yet
    assert log.wants("hello", said(asking)) == (True, True)
    assert log.wants("hello", None) == (True, True)  # remembered from its last lease
    quiet = asking.model_copy(update={"access_log": False, "access_log_query": False})
    assert log.wants("hello", said(quiet)) == (False, False)
    assert log.wants("hello", None) == (False, False)
    log.every_app = True
    assert log.wants("other", None) == (True, False)
