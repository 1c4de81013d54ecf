"""Spare leases handed back while their pool is short (`LeaseCache._give_back_spares`), on
the package's `FakeLeases`: what a request does while the hand-back awaits the activator."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from tests.support.waiting import eventually
from wakeful.ingress.cache import LeaseCache
from wakeful.ingress.cacherules import Use
from wakeful.testing import FakeLeases, FakeSandbox, ManualClock

pytestmark = pytest.mark.anyio
KEY = ("app", None)


class Releasing(FakeLeases):
    """`FakeLeases` that runs `meanwhile` once while a release is out (as a request's turn
    of the event loop would)."""

    meanwhile: Callable[[], None] | None = None

    def heed_short(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Never told: as over plain HTTP, only a renewal says the pool is short."""
        return lambda: None

    async def release(self, lease_id: str) -> None:
        await super().release(lease_id)
        hook, self.meanwhile = self.meanwhile, None
        if hook is not None:
            hook()


async def request(cache: LeaseCache) -> Use:
    return cache.take(KEY) or await cache.acquire(KEY)


async def test_a_lease_used_while_the_hand_back_awaits_is_no_spare() -> None:
    """Two quiet leases are spares when a renewal says the pool is short (another ingress
    got an overflow lease); while the first
    goes back, a request runs on the second and ends. That one carried a request a moment
    ago: it stays, as a lease between two requests of a steady load does (`spares`)."""
    clock = ManualClock()
    fake = Releasing({"app": [FakeSandbox("sb", "http://127.0.0.1:1", 2)]}, clock=clock)
    cache = LeaseCache(fake, idle_ttl=30, clock=clock)
    first, second = await request(cache), await request(cache)
    assert first.lease is not second.lease
    for use in (first, second):
        cache.put(use)
    clock.advance(5)
    other_ingress = LeaseCache(fake, idle_ttl=30, clock=clock)
    overflow = await request(other_ingress)  # the sandbox is full: the pool is short
    assert overflow.lease.grant.overflow
    if (freed := other_ingress.put(overflow)) is not None:
        await other_ingress.release(freed)
    [_first_back, other] = cache.snapshot()

    def a_request_on_the_other() -> None:
        use = cache.take(KEY)
        assert use is not None and use.lease is other
        assert cache.put(use) is None

    fake.meanwhile = a_request_on_the_other
    await cache.maintain()  # the renewals say short: the first goes back first
    assert cache.snapshot() == [other]
    assert fake.leased == {"sb": 1}
    await cache.close()


async def test_a_quiet_ingress_told_its_pool_is_short_hands_its_spares_back_at_once() -> None:
    """Issue 42: this ingress's burst took both normal leases of the sandbox and went
    quiet; another ingress's request gets an overflow lease. The activator says the pool
    turned short as it does (`Leases.heed_short`): the spares go back then, with no renewal
    of this ingress's (a quiet one renews a third of a TTL apart), and the other's next
    request gets a normal lease."""
    clock = ManualClock()
    fake = FakeLeases({"app": [FakeSandbox("sb", "http://127.0.0.1:1", 2)]}, clock=clock)
    quiet = LeaseCache(fake, idle_ttl=30, clock=clock)
    for use in [await request(quiet), await request(quiet)]:
        quiet.put(use)
    clock.advance(5)
    busy = LeaseCache(fake, idle_ttl=30, clock=clock)
    overflow = await request(busy)
    assert overflow.lease.grant.overflow
    if (freed := busy.put(overflow)) is not None:
        await busy.release(freed)
    await eventually(lambda: quiet.snapshot() == [])
    assert fake.leased == {"sb": 0}
    normal = await request(busy)
    assert not normal.lease.grant.overflow
    busy.put(normal)
    assert fake.heeding == 2
    await busy.close()
    await quiet.close()
    assert fake.heeding == 0  # a closed cache listens no more


async def test_leases_in_use_at_the_news_go_back_once_quiet_within_the_spell() -> None:
    """The news comes once a spell. This ingress's last requests ended a moment before it
    (no spares then: a lease between two requests stays); a `maintain` once they are quiet,
    within `SHORT_SECONDS` of the news, hands them back with no renewal of theirs (found by a
    review: they stayed until their quiet renewal, a third of a TTL later). Past the spell,
    nothing goes."""
    clock = ManualClock()
    fake = FakeLeases({"app": [FakeSandbox("sb", "http://127.0.0.1:1", 2)]}, clock=clock)
    quiet = LeaseCache(fake, idle_ttl=30, clock=clock, report_every=10)  # renews nothing
    uses = [await request(quiet), await request(quiet)]
    clock.advance(1.6)
    for use in uses:
        quiet.put(use)
    clock.advance(0.2)
    busy = LeaseCache(fake, idle_ttl=30, clock=clock)
    overflow = await request(busy)  # the news: both leases here were in use 0.2 s ago
    assert overflow.lease.grant.overflow
    if (freed := busy.put(overflow)) is not None:
        await busy.release(freed)
    await quiet.maintain()
    assert len(quiet.snapshot()) == 2  # not quiet for long enough yet
    clock.advance(1)
    await quiet.maintain()  # nothing to renew: told, within the spell
    assert quiet.snapshot() == []
    await busy.close()
    await quiet.close()


async def test_news_of_another_version_leaves_this_ones_leases() -> None:
    """A pool is an app's version: news that another version's pool turned short (a rollout,
    a split) hands back none of the leases on this one."""
    clock = ManualClock()
    fake = FakeLeases(
        {"app": [FakeSandbox("sb", "http://127.0.0.1:1", 2)]}, clock=clock, on_version="v1"
    )
    cache = LeaseCache(fake, idle_ttl=30, clock=clock)
    for use in [await request(cache), await request(cache)]:
        cache.put(use)
    clock.advance(5)
    fake.tell_short("app", "v2")
    await anyio.sleep(0.05)  # what the news started has run
    await cache.maintain()
    assert len(cache.snapshot()) == 2
    fake.tell_short("app", "v1")
    await eventually(lambda: cache.snapshot() == [])
    await cache.close()


async def test_a_closing_cache_waits_for_the_hand_backs_under_way() -> None:
    """A request's freed lease goes back in a task of its own (`release_soon`: compiled, an
    `await` in the request's `finally` would lose a cancellation); a cache that closes
    waits for such tasks, so none is cut short with the ingress and left to its TTL."""
    fake = FakeLeases({"app": [FakeSandbox("sb", "http://127.0.0.1:1", 1)]})
    cache = LeaseCache(fake, idle_ttl=30)
    first = await request(cache)
    overflow = await request(cache)  # the sandbox is full: an overflow lease, for one
    assert overflow.lease.grant.overflow
    freed = cache.put(overflow)
    assert freed is not None
    cache.release_soon(freed)
    cache.put(first)
    await cache.close()
    assert fake.leased == {"sb": 0}
