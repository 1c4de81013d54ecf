"""Where a proxied request's time went: `Server-Timing` on the answer (only when the app or the
ingress asks: it tells anyone whether the app was asleep), and the same phases as histograms
per app in /metrics, always. Also the ingress's traffic reports to the activator."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import anyio
import httpx
import pytest

from tests.support.ingress import Stack, stack
from wakeful.domain.models import AppSpec, Concurrency
from wakeful.ingress.headers import server_timing

pytestmark = pytest.mark.anyio
TIMING = re.compile(
    r'^queue;dur=([\d.]+), (?:wake;dur=([\d.]+);desc="(?:start|thaw)", )?upstream;dur=([\d.]+)$'
)


def phases(answer: httpx.Response) -> tuple[float, float | None, float]:
    match = TIMING.match(answer.headers["server-timing"])
    assert match, answer.headers["server-timing"]
    queue, wake, upstream = match.groups()
    return float(queue), None if wake is None else float(wake), float(upstream)


def observed(s: Stack, phase: str) -> float:
    return s.sample("request_phase_seconds_count", app="hello", phase=phase)


async def test_off_by_default_but_the_phases_are_always_measured(
    hello: Callable[[], int],
) -> None:
    async with stack({"sb-1": hello()}) as s:
        for _ in range(3):
            answer = await s.client.get("/")
            assert answer.status_code == 200
            assert "server-timing" not in answer.headers
        assert observed(s, "queue") == 3 and observed(s, "upstream") == 3
        assert observed(s, "wake") == 0  # nothing woke it: a sandbox was ready


async def test_an_app_that_asks_gets_it_and_so_does_every_app_when_the_ingress_does(
    hello: Callable[[], int],
) -> None:
    spec = AppSpec(command=["serve"], concurrency=Concurrency(requests_per_instance=5))
    asking = {"spec": spec.model_copy(update={"server_timing": True})}
    async with stack({"sb-1": hello()}, pool_update=asking) as s:
        first, again = await s.client.get("/"), await s.client.get("/")
        _, wake, upstream = phases(first)
        assert wake is None and upstream > 0
        assert phases(again)[0] == 0.0  # a cached lease: no wait at all
    async with stack({"sb-1": hello()}, server_timing=True) as s:
        assert phases(await s.client.get("/"))[1] is None


async def test_a_request_that_woke_the_app_says_how_long_it_waited(
    hello: Callable[[], int],
) -> None:
    async with stack({"sb-1": None}, server_timing=True) as s:  # booting: nothing ready
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await s.client.get("/"))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            with anyio.fail_after(10):
                while not any(p.waiters for p in s.activator.snapshot()):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            await anyio.sleep(0.05)  # it waits a while: the wake shows it
            await s.put_sandbox("sb-1", hello())
        queue, wake, _ = phases(answers[0])
        assert wake is not None and 50 <= wake <= queue
        assert 'desc="start"' in answers[0].headers["server-timing"]  # a boot, not a thaw
        assert observed(s, "wake") == 1
        later = await s.client.get("/")
        assert phases(later)[1] is None  # awake now: nobody else paid for it
        assert observed(s, "wake") == 1


async def test_the_ingress_reports_what_it_answered_to_the_activator(
    hello: Callable[[], int],
) -> None:
    """The dashboard's charts: counts and latency per app, from the ingress's own metrics,
    reported beside the lease renewals (in-process here; over the lease channel apart)."""
    async with stack({"sb-1": hello()}, traffic_report_interval=0.05) as s:
        for _ in range(7):
            assert (await s.client.get("/")).status_code == 200
        assert (await s.client.get("/", headers={"Host": "nowhere.localhost"})).status_code == 404

        with anyio.fail_after(10):
            while s.activator.traffic.requests("hello") < 7:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        # Reports go on (every 50 ms): one more answer is counted once, and the 7 are not
        # counted again (a report of totals rather than of what is new would double them).
        assert (await s.client.get("/")).status_code == 200
        with anyio.fail_after(10):
            while s.activator.traffic.requests("hello") < 8:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert s.activator.traffic.requests("hello") == 8
        assert s.activator.traffic.requests("nowhere") == 0
        series = s.activator.traffic.series("hello", time.time())
        assert any(p is not None for p in series["p50_ms"])


@pytest.mark.parametrize(
    ("phases_", "expected"),
    [
        ((0.0, 0.0, 0.000234), b"queue;dur=0.0, upstream;dur=0.2"),
        (
            (0.0123, 0.01, 0.23466, "thaw"),
            b'queue;dur=12.3, wake;dur=10.0;desc="thaw", upstream;dur=234.7',
        ),
        (
            (0.00005, 0.002, 1.23449, "start"),
            b'queue;dur=0.1, wake;dur=2.0;desc="start", upstream;dur=1234.5',
        ),
        ((0.0, 0.5, 12.0, "other"), b"queue;dur=0.0, wake;dur=500.0, upstream;dur=12000.0"),
        ((0.0999, 0.0, 0.09996), b"queue;dur=99.9, upstream;dur=100.0"),  # the table's edge
        ((0.0, 0.0, -0.001), b"queue;dur=0.0, upstream;dur=0.0"),
    ],
)
def test_the_header_gives_each_phase_in_milliseconds_to_a_tenth(
    phases_: tuple[float, float, float] | tuple[float, float, float, str], expected: bytes
) -> None:
    assert server_timing(*phases_) == expected
