"""The log directory's rules: segment names, reading order, retention, times, sampling."""

from __future__ import annotations

import pytest

from wakeful.domain.logfiles import (
    Limits,
    Segment,
    expired,
    line_text,
    parse_segment,
    parse_time,
    reading_order,
)
from wakeful.domain.sampling import Sampler

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("name", "found"),
    [
        pytest.param(
            "1796449379138-t42.jsonl",
            Segment("shop", "output", 1796449379138, None, "t42"),
            id="an open segment",
        ),
        pytest.param(
            "1796449379138-1796449380000-u18f3a.jsonl.gz",
            Segment("shop", "output", 1796449379138, 1796449380000, "u18f3a"),
            id="a closed one",
        ),
        pytest.param(".1796449379138-1796449380000-t1.jsonl.gz.tmp", None, id="a temporary"),
        pytest.param("1796449380000-1796449379138-t1.jsonl.gz", None, id="ends before it starts"),
        pytest.param("1796449379138-T1.jsonl", None, id="a writer in capitals"),
        pytest.param("179644937913-t1.jsonl", None, id="12 digits"),
        pytest.param("notes.txt", None, id="anything else"),
    ],
)
def test_a_segment_is_read_from_its_name(name: str, found: Segment | None) -> None:
    segment = parse_segment("shop", "output", name)
    assert segment == found
    if segment is not None:
        assert segment.name == name


def test_segments_read_by_start_and_a_closed_one_hides_the_file_it_was_made_from() -> None:
    opened = Segment("a", "output", 2000, None, "t1")
    closed = Segment("a", "output", 2000, 2500, "t1")
    older = Segment("a", "output", 1000, 1900, "t0")
    other = Segment("a", "output", 2100, None, "t2")
    assert reading_order([other, opened, closed, older]) == [older, closed, other]


def test_a_segment_meets_a_range_it_overlaps_and_an_open_one_runs_to_now() -> None:
    closed = Segment("a", "output", 1000, 2000, "t1")
    assert closed.meets(1500, None) and closed.meets(None, 1000) and closed.meets(2000, 3000)
    assert not closed.meets(2001, None) and not closed.meets(None, 999)
    assert Segment("a", "output", 1000, None, "t1").meets(10**12, None)


LIMITS = Limits(retention=3600, max_bytes=1000, app_max_bytes=400)


def seg(app: str, start_s: float, end_s: float | None, size: int) -> Segment:
    end = None if end_s is None else int((NOW + end_s) * 1000)
    return Segment(app, "output", int((NOW + start_s) * 1000), end, "t1", size)


@pytest.mark.parametrize(
    ("segments", "gone"),
    [
        pytest.param(
            [seg("a", -7300, -7200, 10), seg("a", -100, -50, 10), seg("a", -7200, None, 10)],
            [0],
            id="past the retention age, but never an open one",
        ),
        pytest.param(
            [seg("a", -300, -200, 200), seg("a", -200, -100, 200), seg("a", -100, None, 100)],
            [0],
            id="an app over its bound loses its oldest until it fits, open ones counted",
        ),
        pytest.param(
            [seg(app, -300 + i, -200 + i, 300) for i, app in enumerate("abcd")],
            [0],
            id="the directory over its bound loses the oldest of all",
        ),
        pytest.param(
            [seg("a", -100, -50, 100), seg("b", -100, -60, 100)],
            [],
            id="within every bound nothing goes",
        ),
    ],
)
def test_retention_deletes_the_oldest_closed_segments_first(
    segments: list[Segment], gone: list[int]
) -> None:
    assert expired(segments, int(NOW * 1000), LIMITS) == [segments[i] for i in gone]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("90s", NOW - 90),
        ("15m", NOW - 900),
        ("1.5h", NOW - 5400),
        ("2d", NOW - 172800),
        ("250ms", NOW - 0.25),
        ("1733377200", 1733377200.0),
        ("2024-12-05T05:40:00Z", 1733377200.0),
        ("2024-12-05T06:40:00+01:00", 1733377200.0),
        ("2024-12-05T05:40:00", 1733377200.0),
    ],
)
def test_a_time_is_a_duration_back_a_moment_or_seconds(value: str, seconds: float) -> None:
    assert parse_time(value, NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["yesterday", "5 minutes", "-1h", ""])
def test_what_is_not_a_time_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"{value!r}: not a time"):
        parse_time(value, NOW)


def test_under_its_rate_the_sampler_keeps_every_line() -> None:
    sampler = Sampler(rate=10)
    assert [sampler.keep(window) for window in range(3) for _ in range(10)] == [1] * 30


def test_past_its_rate_each_kept_line_stands_for_the_lines_left_out() -> None:
    sampler = Sampler(rate=10)
    first = [sampler.keep(0) for _ in range(40)]
    assert first[:10] == [1] * 10  # then 1 in 2, each for 2, up to twice the rate
    assert first[10:30] == [0, 2] * 10 and first[30:] == [0] * 10 and sampler.dropped == 5
    second = [sampler.keep(1) for _ in range(40)]
    assert set(second) == {0, 4} and sum(second) == 40  # sized from the window before
    assert sum(1 for k in second if k) == 10


def test_the_sampler_never_keeps_more_than_twice_its_rate_in_a_window() -> None:
    sampler = Sampler(rate=10)
    kept = [sampler.keep(0) for _ in range(1000)]
    assert sum(1 for k in kept if k) == 20
    assert sampler.dropped == 1000 // 2 - 20 + 5  # the rest of 1 in 2, past the cap


def test_a_quiet_spell_starts_the_sampler_again() -> None:
    sampler = Sampler(rate=10)
    for _ in range(100):
        sampler.keep(0)
    assert [sampler.keep(5) for _ in range(3)] == [1, 1, 1]


def test_lines_read_as_a_person_reads_them() -> None:
    output = {"sandbox": "shop-v2-ab", "line": "ready"}
    assert line_text(output, "output") == "[shop-v2-ab] ready"
    access = {
        "sandbox": "shop-v2-ab",
        "method": "GET",
        "path": "/cart",
        "status": 200,
        "bytes": 512,
        "ms": 3.1,
        "version": "v2",
        "wake": "thaw",
        "id": "r-1",
        "sample": 4,
    }
    assert line_text(access, "access") == (
        "[shop-v2-ab] GET /cart 200 512B 3.1ms version=v2 woke=thaw id=r-1 (1 in 4)"
    )
    call = {**access, "method": "POST", "path": "/a.B/C", "grpc_status": 14, "sample": 1}
    assert line_text(call, "access") == (
        "[shop-v2-ab] POST /a.B/C 200 512B 3.1ms grpc=UNAVAILABLE version=v2 woke=thaw id=r-1"
    )
    assert "grpc=42 " in line_text({**call, "grpc_status": 42}, "access")  # as its number
    assert line_text({"wakeful": "3 lines lost here"}, "access") == "[wakeful] 3 lines lost here"


@pytest.mark.parametrize("value", ["1" * 400, "9" * 400 + "s", "100000000000.5", "\u0661\u0662"])
def test_a_time_past_any_clock_or_in_other_digits_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a time"):
        parse_time(value, NOW)
