"""Lease use through the real stack: invariants 7-10 of docs/architecture.md."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

from tests.support.ingress import Stack, closed_port, held, stack
from tests.support.waiting import eventually
from wakeful.activator.client import InProcessLeases
from wakeful.domain.models import SandboxStatus
from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.cacherules import Use
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_a_size_s_lease_never_carries_s_plus_one_requests(hello: Callable[[], int]) -> None:
    # rpi 10 gives leases of size 2: the third concurrent request needs a second lease.
    release = anyio.Event()
    async with (
        stack({"sb-1": hello()}, rpi=10, max_instances=1) as s,
        anyio.create_task_group() as tg,
    ):
        for n in range(1, 4):
            tg.start_soon(held, s.client, release)
            await eventually(lambda n=n: s.sample("requests_in_flight", app="hello") == n)  # type: ignore[misc]
        cached = s.ingress.cache.snapshot()
        assert all(entry.uses <= entry.grant.size for entry in cached)
        assert [entry.uses for entry in cached] == [2, 1]
        assert s.activator.leased_on("sb-1") == 4  # two leases cover three requests
        assert s.sample("lease_cache_hits_total", app="hello") == 1
        assert s.sample("lease_cache_misses_total", app="hello") == 2
        release.set()


async def test_an_overflow_lease_carries_one_request_and_goes_straight_back(
    hello: Callable[[], int],
) -> None:
    # rpi 1: one normal lease of size 1 fills the sandbox; the next request overflows.
    release = anyio.Event()
    async with stack({"sb-1": hello()}, rpi=1, max_instances=1) as s:
        async with anyio.create_task_group() as tg:
            tg.start_soon(held, s.client, release)
            await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1)
            overflowed = await s.client.get("/")
            assert overflowed.status_code == 200
            assert s.activator.snapshot()[0].overflow == 0  # released right after its request
            assert s.activator.leased_on("sb-1") == 1  # only the cached normal lease
            assert [e.grant.overflow for e in s.ingress.cache.snapshot()] == [False]
            release.set()
        hits = s.sample("lease_cache_hits_total", app="hello")
        assert (await s.client.get("/")).status_code == 200
        assert s.sample("lease_cache_hits_total", app="hello") == hits + 1
        assert s.activator.leased_on("sb-1") == 1


async def test_a_client_that_hangs_up_mid_download_leaves_nothing_leased(
    hello: Callable[[], int],
) -> None:
    async with stack({"sb-1": hello()}, lease_idle_ttl=0.3, maintenance_interval=0.05) as s:
        async with s.client.stream("GET", f"/bytes?n={10**12}") as answer:
            received = 0
            async for chunk in answer.aiter_raw():
                received += len(chunk)
                if received > 1 << 20:
                    break
        # The ingress must notice, stop the transfer, and hand its use back; the idle
        # lease then goes back to the activator.
        await eventually(lambda: s.activator.leased_on("sb-1") == 0)
        assert s.ingress.cache.snapshot() == []
        assert s.sample("requests_in_flight", app="hello") == 0
        assert s.sample("requests_total", app="hello", status_class="4xx") == 1


async def test_an_idle_lease_is_handed_back_and_a_gone_one_dropped(
    hello: Callable[[], int],
) -> None:
    async with stack(
        {"sb-1": hello()},
        lease_idle_ttl=60,
        maintenance_interval=0.05,
        activator={"lease_ttl": 0.6},  # renewed every 0.2 s
    ) as s:
        assert (await s.client.get("/")).status_code == 200
        [entry] = s.ingress.cache.snapshot()
        s.activator.release(entry.grant.lease_id)  # the activator forgets it (say, expiry)
        await eventually(lambda: s.ingress.cache.snapshot() == [])  # renew said LeaseGone
        assert (await s.client.get("/")).status_code == 200
        assert s.sample("lease_cache_misses_total", app="hello") == 2
    async with stack({"sb-1": hello()}, lease_idle_ttl=0.2, maintenance_interval=0.05) as s:
        assert (await s.client.get("/")).status_code == 200
        assert s.activator.leased_on("sb-1") == 1
        await eventually(lambda: s.activator.leased_on("sb-1") == 0)


async def test_a_queued_request_is_counted_as_queued_not_in_flight(
    hello: Callable[[], int],
) -> None:
    port = hello()
    async with stack({"sb-1": None}) as s, anyio.create_task_group() as tg:
        answers: list[int] = []
        release = anyio.Event()

        async def call() -> None:
            answers.append(await held(s.client, release))

        tg.start_soon(call)
        await eventually(lambda: s.sample("requests_queued", app="hello") == 1)
        assert s.sample("requests_in_flight", app="hello") == 0
        await s.put_sandbox("sb-1", port, SandboxStatus.RUNNING)
        await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1)
        assert s.sample("requests_queued", app="hello") == 0
        release.set()
        await eventually(lambda: len(answers) == 1)
        assert answers == [200]
        assert s.sample("requests_in_flight", app="hello") == 0
        assert s.sample("requests_queued", app="hello") == 0


async def test_a_retried_request_is_counted_once(hello: Callable[[], int]) -> None:
    # sb-a refuses connections; admission picks it first (ties go to the first id).
    async with (
        stack({"sb-a": closed_port(), "sb-b": hello()}) as s,
        anyio.create_task_group() as tg,
    ):
        answers: list[int] = []
        release = anyio.Event()

        async def call() -> None:
            answers.append(await held(s.client, release))

        tg.start_soon(call)
        await eventually(lambda: s.sample("connect_retries_total", app="hello") == 1)
        await eventually(lambda: s.activator.leased_on("sb-b") == 1)
        assert s.sample("requests_in_flight", app="hello") == 1
        assert s.sample("requests_queued", app="hello") == 0
        release.set()
        await eventually(lambda: len(answers) == 1)
        assert answers == [200]
        assert s.sample("requests_in_flight", app="hello") == 0


async def test_a_sandbox_leaving_admission_takes_its_cached_leases_with_it(
    hello: Callable[[], int],
) -> None:
    # Idle TTL and renewals far away: only the sandbox watch can drop the lease quickly.
    async with stack({"sb-1": hello(), "sb-2": hello()}, lease_idle_ttl=600, rpi=10) as s:
        assert (await s.client.get("/")).status_code == 200
        (cached,) = s.ingress.cache.snapshot()
        draining = cached.grant.sandbox_id
        port = int(cached.grant.url.rsplit(":", 1)[1])
        await s.put_sandbox(draining, port, SandboxStatus.DRAINING)
        await eventually(lambda: s.activator.leased_on(draining) == 0)
        assert s.ingress.cache.snapshot() == []
        answer = await s.client.get("/")  # a new request goes to the other sandbox
        assert answer.status_code == 200
        assert [e.grant.sandbox_id for e in s.ingress.cache.snapshot()] != [draining]


async def outlive_the_ttl_twice(s: Stack, clock: ManualClock, ttl: float) -> None:
    """Two lease TTLs pass, in steps shorter than a third of one, each followed by the
    ingress's upkeep and then the activator's expiry, in that order: what a healthy ingress
    does in time, with no race against a loaded machine."""
    passed = 0.0
    while passed < 2 * ttl:
        clock.advance(ttl / 3)
        passed += ttl / 3
        await s.ingress.cache.maintain()
        s.activator.expire_leases()


async def test_a_lease_carrying_a_long_request_is_renewed_even_out_of_the_cache(
    hello: Callable[[], int],
) -> None:
    # rpi 1, one sandbox: the second request overflows. Both outlive the lease TTL twice;
    # neither lease may expire while its request runs.
    clock = ManualClock()
    release = anyio.Event()
    async with stack(
        {"sb-1": hello()},
        rpi=1,
        max_instances=1,
        clock=clock,
        maintenance_interval=60,  # never within the test: it runs the upkeep itself
        activator={"lease_ttl": 1.5, "expiry_interval": 60},
    ) as s:
        statuses: list[int] = []

        async def slow() -> None:
            statuses.append(await held(s.client, release))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1)
            tg.start_soon(slow)
            await eventually(lambda: s.activator.snapshot()[0].overflow == 1)
            # ...and the ingress holds it: the clock moves in steps that need not yield
            await eventually(lambda: [e.grant.overflow for e in s.ingress.cache.held()] == [True])
            await outlive_the_ttl_twice(s, clock, ttl=1.5)
            assert s.activator.leased_on("sb-1") == 2  # the cached lease and the overflow
            release.set()
        assert statuses == [200, 200]
        expired = s.registry.get_sample_value(
            "wakeful_activator_expired_leases_total", {"pool": "hello-v1"}
        )
        assert not expired


async def test_a_long_request_on_a_draining_sandbox_keeps_its_lease_to_the_end(
    hello: Callable[[], int],
) -> None:
    # The request outlives the lease TTL twice over, and its sandbox starts draining first:
    # the lease must stay valid (so the controller does not stop the sandbox under it), then
    # go back once the request ends.
    clock = ManualClock()
    release = anyio.Event()
    async with stack(
        {"sb-1": hello()},
        rpi=10,
        clock=clock,
        maintenance_interval=60,
        activity_report_interval=0.2,
        activator={"lease_ttl": 1.5, "expiry_interval": 60},
    ) as s:
        statuses: list[int] = []

        async def slow() -> None:
            statuses.append(await held(s.client, release))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await eventually(lambda: s.sample("requests_in_flight", app="hello") == 1)
            (cached,) = s.ingress.cache.snapshot()
            port = int(cached.grant.url.rsplit(":", 1)[1])
            await s.put_sandbox("sb-1", port, SandboxStatus.DRAINING)
            await eventually(lambda: s.ingress.cache.snapshot() == [])  # left admission
            await outlive_the_ttl_twice(s, clock, ttl=1.5)
            assert s.activator.leased_on("sb-1") > 0
            release.set()
        assert statuses == [200]
        expired = s.registry.get_sample_value(
            "wakeful_activator_expired_leases_total", {"pool": "hello-v1"}
        )
        assert not expired
        await eventually(lambda: s.activator.leased_on("sb-1") == 0)


async def test_misses_waiting_together_lose_no_lease_and_share_what_is_granted(
    hello: Callable[[], int],
) -> None:
    """Twenty requests wait for a booting sandbox. When it is ready, a waiting request may
    take room in a lease another one was granted (its own ask is called off); an ask granted
    anyway puts its lease in the cache. Every lease the activator counts is in the cache."""
    port = hello()
    async with stack({"sb-1": None}, rpi=10) as s, anyio.create_task_group() as tg:
        answers: list[int] = []

        async def call() -> None:
            answers.append((await s.client.get("/")).status_code)

        for _ in range(20):
            tg.start_soon(call)
        await eventually(lambda: s.sample("requests_queued", app="hello") == 20)
        await s.put_sandbox("sb-1", port, SandboxStatus.RUNNING)
        await eventually(lambda: len(answers) == 20)
        assert answers == [200] * 20

        def in_cache() -> int:
            return sum(entry.grant.size for entry in s.ingress.cache.snapshot())

        await eventually(lambda: s.leased() == in_cache())
        cached = s.ingress.cache.snapshot()
        assert all(entry.uses == 0 for entry in cached)
        assert len(cached) < 20, cached  # some waiters took room, not a lease of their own


async def test_a_long_request_counts_as_activity_until_it_ends(hello: Callable[[], int]) -> None:
    """The activator's last activity for a sandbox is the end of its last request, not the
    last renewal during it: a stream or a WebSocket that ends gives its app the whole
    scale_down_delay from its end (renewals clear `used`; the use's return sets it again)."""
    async with stack({"sb-1": hello()}, activity_report_interval=0.2) as s:
        answer = await s.client.get("/sleep?s=1")
        assert answer.status_code == 200
        ended = time.time()
        await eventually(lambda: s.activator._activity.latest("sb-1") >= ended, 5)


KEY = ("hello", "v1")


async def burst(cache: LeaseCache, count: int) -> list[Use]:
    """`count` requests of hello at once on `cache`: the uses they took."""
    uses: list[Use] = []

    async def one() -> None:
        uses.append(cache.take(KEY) or await cache.acquire(KEY))

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    return uses


async def test_two_replicas_bursts_take_the_leases_they_need_not_the_pools(
    hello: Callable[[], int],
) -> None:
    """Issue 42, on the real activator: a sandbox of 100 (leases of 20), and two ingresses,
    each with 32 requests at once. Misses that wait together share asks, so the first
    ingress takes two leases and not all five normal ones; the second gets normal leases
    too, and no request of either needs an overflow lease (one activator call each)."""
    async with stack({"sb-1": hello()}, rpi=100) as s:
        other = LeaseCache(InProcessLeases(s.activator), idle_ttl=60)
        first = await burst(s.ingress.cache, 32)
        second = await burst(other, 32)
        for cache, uses in ((s.ingress.cache, first), (other, second)):
            assert not any(use.lease.grant.overflow for use in uses)
            assert len({use.lease.grant.lease_id for use in uses}) == 2  # 32 over leases of 20
            for use in uses:
                cache.put(use)
        [pool] = s.activator.snapshot()
        assert (pool.leased, pool.overflow) == (80, 0)  # four leases of 20, none overflow
        await other.close()


@pytest.mark.parametrize(
    "told", [False, True], ids=["at its next renewal", "told as the pool turns short"]
)
async def test_a_replicas_unused_leases_go_to_another_that_needs_them(
    hello: Callable[[], int], told: bool
) -> None:
    """Issue 42, on the real activator: one replica's burst took every normal lease of the
    sandbox (five of 20) and the burst is over; another replica's request gets an overflow
    lease. The first hands back the leases it is not using instead of keeping them its idle
    TTL (30 s): at its next renewal, which says the pool is short, or, quiet for a while
    (`told`), as the activator tells its holders the pool turned short
    (`Activator.spare_asks`), with no renewal at all (a quiet replica renews a third of a
    TTL apart). The other replica's next request gets a normal lease."""
    clock = ManualClock()
    async with stack(
        {"sb-1": hello()}, rpi=100, max_instances=1, clock=clock, maintenance_interval=60
    ) as s:
        first = s.ingress.cache
        other = LeaseCache(InProcessLeases(s.activator), idle_ttl=30, clock=clock)
        for use in await burst(first, 100):
            first.put(use)
        assert len(first.snapshot()) == 5  # every normal lease of the sandbox, idle
        if told:
            clock.advance(2)  # quiet for longer than a lease between two requests is
        overflowed = await other.acquire(KEY)
        assert overflowed.lease.grant.overflow
        if (freed := other.put(overflowed)) is not None:
            await other.release(freed)
        if told:
            await eventually(lambda: first.snapshot() == [])  # all five, with no renewal
        else:
            clock.advance(5)  # a renewal is due (traffic to report), within the idle TTL
            await first.maintain()
            assert first.snapshot() == []  # all five went back
        normal = other.take(KEY) or await other.acquire(KEY)
        assert not normal.lease.grant.overflow
        other.put(normal)
        await other.close()


async def test_an_ingress_keeps_its_quiet_leases_when_the_overflow_was_its_own(
    hello: Callable[[], int],
) -> None:
    """The activator's ask for spare leases does not say whose request was short: an ingress
    alone whose burst went past the sandbox's capacity (five leases of 20 and an overflow
    one) keeps its quiet leases for its next burst rather than hand them back at once."""
    clock = ManualClock()
    async with stack(
        {"sb-1": hello()}, rpi=100, max_instances=1, clock=clock, maintenance_interval=60
    ) as s:
        cache = s.ingress.cache
        uses = await burst(cache, 101)
        assert sum(use.lease.grant.overflow for use in uses) == 1
        for use in uses:
            if (freed := cache.put(use)) is not None:
                await cache.release(freed)
        clock.advance(5)  # a renewal is due; the pool is short (its own overflow)
        await cache.maintain()
        assert len(cache.snapshot()) == 5


async def test_a_burst_past_the_waiting_bound_wakes_its_app_and_is_served(
    hello: Callable[[], int],
) -> None:
    """Thirty requests at once for a booting sandbox, the activator bounded at ten waiting
    (`WAKEFUL_MAX_WAITERS`): their shared ask counts ten and the rest ride it uncounted; once
    the sandbox is up every one gets a use. An ask refused whole for its riders past the
    bound refused all thirty, and at every retry of such a burst."""
    port = hello()
    async with stack({"sb-1": None}, rpi=100, activator={"max_waiters": 10}) as s:
        uses: list[Use] = []

        async def thirty() -> None:
            uses.extend(await burst(s.ingress.cache, 30))

        async with anyio.create_task_group() as tg:
            tg.start_soon(thirty)
            await eventually(lambda: s.activator.snapshot()[0].waiters == 10)
            await s.put_sandbox("sb-1", port, SandboxStatus.RUNNING)
        assert len(uses) == 30
        for use in uses:
            if (freed := s.ingress.cache.put(use)) is not None:
                await s.ingress.cache.release(freed)
