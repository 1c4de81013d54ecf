"""Each client's share of requests under way (`ingress.clients`): its rules, and a client past
its share answered 429 while other clients are served, over HTTP/1.1 and HTTP/2."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import pytest

from tests.support.ingress import Stack, closed_port, held, stack
from tests.support.waiting import eventually
from wakeful.domain.models import App
from wakeful.ingress.clients import MAX_KEY, ClientShares, client_key


@pytest.mark.parametrize(
    ("peer", "forwarded", "key"),
    [
        ("10.1.2.3", None, "10.1.2.3"),
        ("", None, ""),  # no address (a Unix socket): one client
        ("2001:db8:1:2:aaaa::1", None, "2001:db8:1:2::/64"),  # an IPv6 host has its /64
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", None, "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", None, "2001:db8:1:3::/64"),
        ("::ffff:10.1.2.3", None, "10.1.2.3"),  # IPv4 as a dual-stack socket shows it
        ("::1", None, "::/64"),
        ("fe80::1%eth0", None, "fe80::/64"),  # a link-local address's zone is no new client
        ("fe80::2%eth1", None, "fe80::/64"),
        # A trusted balancer's entry is the last: what the client wrote before it is not.
        ("10.0.0.1", b"203.0.113.9", "203.0.113.9"),
        ("10.0.0.1", b"198.51.100.1, 203.0.113.9", "203.0.113.9"),
        ("10.0.0.1", b"203.0.113.9 ,2001:db8::7 ", "2001:db8::/64"),
        ("10.0.0.1", b"", "10.0.0.1"),  # an empty field: the balancer itself
        ("10.0.0.1", b"a, ", "10.0.0.1"),
        ("10.0.0.1", b"unknown", "unknown"),  # no address: as it is, bounded
        ("10.0.0.1", b"x:" * 100, ("x:" * 100)[:MAX_KEY]),
        # A balancer that writes the client's port too: still one key per client.
        ("10.0.0.1", b"203.0.113.9:41234", "203.0.113.9"),
        ("10.0.0.1", b"[2001:db8:1:2::5]:41234", "2001:db8:1:2::/64"),
        ("10.0.0.1", b"[2001:db8:1:2::5]", "2001:db8:1:2::/64"),
    ],
)
def test_client_key(peer: str, forwarded: bytes | None, key: str) -> None:
    assert client_key(peer, forwarded) == key


def test_shares_bound_each_client_alone() -> None:
    shares = ClientShares(2)
    assert shares.take("a") and shares.take("a")
    assert not shares.take("a") and shares.busy("a") == 2  # refused: nothing counted
    assert shares.take("b")
    shares.give_back("a")
    assert shares.take("a")
    for key in ("a", "a", "b"):
        shares.give_back(key)
    assert len(shares) == 0  # nobody with a request under way is remembered


@contextlib.asynccontextmanager
async def _two_held(
    s: Stack, client: httpx.AsyncClient, headers: dict[str, str] | None = None
) -> AsyncIterator[list[int]]:
    """Two requests of `client` under way (`held`) while the block runs; released at its end,
    their statuses in the list once they are answered."""
    release = anyio.Event()
    statuses: list[int] = []

    async def hold() -> None:
        statuses.append(await held(client, release, headers=headers))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(hold)
        tasks.start_soon(hold)
        await eventually(lambda: s.sample("requests_in_flight", app="hello") == 2, 10)
        try:
            yield statuses
        finally:
            release.set()


async def test_a_client_past_its_share_gets_429_and_others_are_served(
    hello: Callable[[], int],
) -> None:
    async with (
        stack({"s1": hello()}, rpi=100, requests_per_client=2) as s,
        httpx.AsyncClient(
            base_url=s.url,
            headers={"Host": "hello.localhost"},
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
            timeout=30,
        ) as elsewhere,
    ):
        async with _two_held(s, s.client) as statuses:
            third = await s.client.get("/", headers={"Accept": "application/json"})
            assert third.status_code == 429, third.text
            assert third.headers["retry-after"] == "1"
            assert third.json()["error"] == "too many requests"
            assert "127.0.0.1" in third.json()["detail"]
            assert (await elsewhere.get("/")).status_code == 200  # its own share
        assert statuses == [200, 200]
        assert (await s.client.get("/")).status_code == 200  # its share came back
        assert s.sample("requests_total", app="hello", status_class="4xx") == 1


async def test_each_http2_stream_counts(hello: Callable[[], int]) -> None:
    """One HTTP/2 connection carries many requests at once: each counts, as in nginx."""
    async with (
        stack({"s1": hello()}, rpi=100, requests_per_client=2) as s,
        httpx.AsyncClient(
            base_url=s.url,
            headers={"Host": "hello.localhost"},
            http1=False,
            http2=True,
            timeout=30,
        ) as h2,
    ):
        async with _two_held(s, h2) as statuses:
            third = await h2.get("/")
            assert third.status_code == 429 and third.http_version == "HTTP/2", third.text
        assert statuses == [200, 200]
        assert (await h2.get("/")).status_code == 200


async def test_behind_a_trusted_balancer_the_forwarded_client_counts(
    hello: Callable[[], int],
) -> None:
    async with stack({"s1": hello()}, rpi=100, requests_per_client=2, trust_forwarded=True) as s:
        # What the client itself wrote first is not who it is: the balancer's entry is last.
        one = {"X-Forwarded-For": "192.0.2.77, 203.0.113.1"}
        async with _two_held(s, s.client, one) as statuses:
            third = await s.client.get("/", headers={"X-Forwarded-For": "203.0.113.1"})
            assert third.status_code == 429, third.text
            other = await s.client.get("/", headers={"X-Forwarded-For": "203.0.113.2"})
            assert other.status_code == 200  # the balancer's own address is not the client
        assert statuses == [200, 200]


async def test_a_refused_request_is_not_one_of_its_versions_answers(
    hello: Callable[[], int],
) -> None:
    """A rollout's verdict compares each version's 5xx share: a 429 the client earned never
    reached the version, so it is not counted among its answers (it would dilute them)."""
    async with stack(
        {"s1": hello()}, rpi=100, requests_per_client=2, traffic_report_interval=60
    ) as s:
        tagged = App(name="hello", active_version="v1", tags={"canary": "v1"})
        await s.store.put("apps/hello", tagged)  # tagged: its answers counted per version
        await eventually(lambda: "hello" in s.ingress.routes.index.counted, 10)
        async with _two_held(s, s.client) as statuses:
            assert (await s.client.get("/")).status_code == 429
        assert statuses == [200, 200]
        report = s.ingress.metrics.traffic_since_last()["hello"]
        assert report.requests == 3  # the app's: the 429 too
        assert (report.versions["v1"].requests, report.versions["v1"].errors) == (2, 0)


async def test_a_share_comes_back_however_the_request_ends(hello: Callable[[], int]) -> None:
    """The client hangs up mid-request (over HTTP/1.1, over HTTP/2), the sandbox cannot be
    reached: each time its share comes back (a share kept would refuse the client for good
    once it had `requests_per_client` of them)."""
    async with stack({"s1": hello()}, rpi=100, requests_per_client=2) as s:
        shares = s.ingress.clients
        for http2 in (False, True):
            async with (
                httpx.AsyncClient(
                    base_url=s.url,
                    headers={"Host": "hello.localhost"},
                    http1=not http2,
                    http2=http2,
                ) as client,
                anyio.create_task_group() as tasks,
            ):
                tasks.start_soon(held, client, anyio.Event())
                await eventually(lambda: shares.busy("127.0.0.1") == 1, 10)
                tasks.cancel_scope.cancel()
            await eventually(lambda: len(shares) == 0, 10)  # the connection closed
    async with stack({"s1": closed_port()}, requests_per_client=2) as s:
        assert (await s.client.get("/")).status_code == 502
        assert len(s.ingress.clients) == 0
