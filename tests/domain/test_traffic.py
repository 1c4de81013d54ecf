"""The activator's 15-minute ring of the ingresses' traffic reports (`wakeful.domain.traffic`):
quantiles from bucket counts, slots by wall clock, bounded memory."""

from __future__ import annotations

import pytest

from wakeful.domain.traffic import BOUNDS, BUCKETS, SLOTS, STEP, AppTraffic, TrafficRing, quantile


def counts(**at: int) -> list[int]:
    """Bucket counts by upper bound in ms (`b5=3`: three answers in 2.5-5 ms)."""
    buckets = [0] * BUCKETS
    for name, n in at.items():
        bound = float(name[1:]) / 1000 if name != "over" else None
        buckets[BOUNDS.index(bound) if bound is not None else len(BOUNDS)] += n  # type: ignore[arg-type]
    return buckets


def test_quantiles_interpolate_within_the_bucket_they_fall_in() -> None:
    assert quantile([0] * BUCKETS, 0.5) is None
    assert quantile(counts(b10=4), 0.5) == pytest.approx(0.0075)  # halfway through 5-10 ms
    assert quantile(counts(b1=50, b100=50), 0.5) == pytest.approx(0.001)
    assert quantile(counts(b1=98, b100=2), 0.99) == pytest.approx(0.075)
    assert quantile(counts(over=3), 0.99) == BOUNDS[-1]  # past every bound: the top one
    assert quantile(counts(b1=1), 0.5) == pytest.approx(0.0005)


def test_reports_add_up_per_slot_and_the_ring_keeps_fifteen_minutes() -> None:
    ring = TrafficRing()
    start = 1_000_000.0
    for ingress in range(2):  # two ingresses, the same slot: their counts add up
        ring.add("web", AppTraffic(requests=10, errors=ingress, buckets=counts(b5=10)), start)
    ring.waiters("web", 3, start)
    ring.waiters("web", 1, start + 1)
    series = ring.series("web", start + STEP - 0.001)
    assert len(series["requests_per_s"]) == SLOTS
    assert series["requests_per_s"][-1] == pytest.approx(20 / STEP)
    assert series["p50_ms"][-1] == pytest.approx(3.75)
    assert series["waiters"][-1] == 3  # the most seen in the slot
    assert series["requests_per_s"][:-1] == [None] * (SLOTS - 1)

    later = start + STEP * 5
    ring.add("web", AppTraffic(requests=1, buckets=counts(b1=1)), later)
    series = ring.series("web", later + 2)
    assert series["requests_per_s"][-6] == pytest.approx(2.0)  # the first slot, 5 steps back
    assert series["requests_per_s"][-1] == pytest.approx(0.5)  # 1 in the 2 s of this slot
    assert series["end"] == pytest.approx((later // STEP + 1) * STEP)

    # Fifteen minutes on, the first slots are gone from the ring itself, not only the series.
    much_later = start + STEP * (SLOTS + 10)
    ring.add("web", AppTraffic(requests=1, buckets=counts(b1=1)), much_later)
    assert len(ring._apps["web"]) == 1
    assert ring.series("web", much_later)["requests_per_s"].count(None) == SLOTS - 1


def test_apps_that_leave_leave_the_ring() -> None:
    ring = TrafficRing()
    ring.add("web", AppTraffic(requests=1, buckets=counts(b1=1)), 0.0)
    ring.add("api", AppTraffic(requests=1, buckets=counts(b1=1)), 0.0)
    ring.keep({"api"})
    assert ring.series("web", 1.0)["requests_per_s"][-1] is None
    assert ring.series("api", 1.0)["requests_per_s"][-1] == 1.0


def test_a_report_is_checked_before_it_is_counted() -> None:
    with pytest.raises(ValueError, match="buckets"):
        AppTraffic(requests=1, buckets=[1])
    with pytest.raises(ValueError, match="requests"):
        AppTraffic(requests=-1, buckets=counts(b1=1))


def test_a_window_sums_the_slots_that_end_after_its_start() -> None:
    ring = TrafficRing()
    for at, errors in ((0.0, 0), (15.0, 1), (25.0, 2)):
        ring.add("web/v2", AppTraffic(requests=10, errors=errors, buckets=counts(b5=10)), at)
    requests, errors, buckets = ring.window("web/v2", 29.0, 10.0)  # slots from 10 s on
    assert (requests, errors, buckets) == (20, 3, counts(b5=20))
    assert ring.window("web/v2", 29.0, 100.0)[0] == 30
    assert ring.window("web/v9", 29.0, 100.0) == (0, 0, [0] * BUCKETS)
    ring.keep({"web"})
    assert ring.window("web/v2", 29.0, 100.0)[0] == 0  # a version not kept is forgotten


def test_a_report_names_at_most_64_versions_of_an_app() -> None:
    one = {"requests": 1, "buckets": counts(b1=1)}
    versions = {f"v{n}": one for n in range(65)}
    with pytest.raises(ValueError, match="at most 64"):
        AppTraffic.model_validate({**one, "versions": versions})
    with pytest.raises(ValueError, match="pattern"):
        AppTraffic.model_validate({**one, "versions": {"Bad/Name": one}})
