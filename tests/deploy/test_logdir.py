"""The log directory's writer and reader on real files, time driven by hand: segments and
their rotation, retention by age and bytes, a torn last line, a full disk, a backlog, two
writers on one directory, and reads across segments."""

from __future__ import annotations

import gzip
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import fill, small_filesystem
from wakeful.deploy import logread
from wakeful.deploy.logdir import LogDir, encode
from wakeful.domain.logfiles import Limits

T0 = 1_800_000_000.0
WIDE = Limits(retention=86400, max_bytes=1 << 30, app_max_bytes=1 << 28)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(root: Path, clock: Clock, writer: str = "t1", **options: Any) -> LogDir:
    options = {"limits": WIDE, "sync": False, "keep_closed": 0, **options}
    found = LogDir(root, writer, options.pop("limits"), clock=clock, **options)
    found.start()
    return found


@pytest.fixture
def logdir(tmp_path: Path, clock: Clock) -> Iterator[LogDir]:
    found = make(tmp_path, clock, segment_bytes=2048)
    yield found
    found.stop()


def write(logdir: LogDir, at: float, *texts: str, app: str = "hello") -> int:
    """Lines `texts` at time `at` (their times a microsecond apart); the lines dropped."""
    lines = [
        encode({"ts": at + i * 1e-6, "app": app, "sandbox": "sb-1", "line": text})
        for i, text in enumerate(texts)
    ]
    dropped = logdir.append(app, "output", lines, at, at + len(texts) * 1e-6).result(timeout=10)
    upkeep(logdir)  # the round the lines were written in is over: a segment they filled closed
    return dropped


def texts(root: Path, app: str = "hello", **query: Any) -> list[str]:
    found = logread.forward(root, app, "output", logread.Query(**query))
    return [json.loads(line).get("line", "") for line in found]


def files(root: Path, app: str = "hello") -> list[str]:
    folder = root / "apps" / app / "output"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def upkeep(logdir: LogDir) -> None:
    """The writer's upkeep, now (it also runs every second on its own)."""
    logdir.upkeep().result(timeout=10)


def test_a_segment_past_its_size_is_closed_and_compressed(logdir: LogDir, clock: Clock) -> None:
    for i in range(40):
        assert write(logdir, T0 + i, f"line {i:02d} " + "x" * 80) == 0
    names = files(logdir.root)
    closed = [n for n in names if n.endswith(".jsonl.gz")]
    assert closed and len([n for n in names if n.endswith(".jsonl")]) == 1
    with gzip.open(logdir.root / "apps/hello/output" / closed[0]) as first:
        assert json.loads(first.readline())["line"].startswith("line 00 ")
    assert [t[:7] for t in texts(logdir.root)] == [f"line {i:02d}" for i in range(40)]
    # A time range opens the segments it meets, and reads only their lines in it.
    assert [t[:7] for t in texts(logdir.root, since=T0 + 30, until=T0 + 32)] == [
        "line 30",
        "line 31",
        "line 32",
    ]
    assert [t[:7] for t in logread_tail(logdir.root, 3)] == ["line 37", "line 38", "line 39"]


def logread_tail(root: Path, n: int, **query: Any) -> list[str]:
    found = logread.tail(root, "hello", "output", logread.Query(**query), n)
    return [json.loads(line)["line"] for line in found]


def test_a_segment_past_its_age_is_closed_by_the_upkeep(tmp_path: Path, clock: Clock) -> None:
    logdir = make(tmp_path, clock, segment_age=60)
    write(logdir, T0, "one")
    clock.now += 61
    upkeep(logdir)
    assert [n.endswith(".gz") for n in files(tmp_path)] == [True]
    write(logdir, clock.now, "two")
    assert texts(tmp_path) == ["one", "two"]
    logdir.stop()


def test_retention_deletes_by_age_then_by_bytes_oldest_first(tmp_path: Path, clock: Clock) -> None:
    limits = Limits(retention=3600, max_bytes=1 << 30, app_max_bytes=64 << 10)
    logdir = make(tmp_path, clock, limits=limits, segment_bytes=2048, segment_age=1e6)
    for i in range(10):
        write(logdir, T0 + i, "x" * 3000)  # one segment each
    write(logdir, T0 + 10, "other", app="other")
    assert len(files(tmp_path)) == 10
    clock.now = T0 + 3600 + 5.5  # lines 0 to 5 are past the retention age
    upkeep(logdir)
    assert len(texts(tmp_path)) == 4 and len(files(tmp_path)) == 4
    clock.now = T0 + 3600 + 20  # every segment of hello is old now; other's is open
    upkeep(logdir)
    assert files(tmp_path) == [] and not (tmp_path / "apps/hello").exists()
    assert texts(tmp_path, "other") == ["other"]  # an open segment is never deleted
    logdir.stop()


def test_an_app_over_its_bound_loses_its_oldest_segments_only(tmp_path: Path, clock: Clock) -> None:
    limits = Limits(retention=86400, max_bytes=1 << 30, app_max_bytes=64 << 10)
    logdir = make(tmp_path, clock, limits=limits)  # segments of 16 KiB: a quarter of it
    for i in range(60):
        write(logdir, T0 + i, f"{i:02d}" + secrets.token_hex(2000))  # compresses to half
    write(logdir, T0, "quiet", app="quiet")
    on_disk = sum(p.stat().st_size for p in (tmp_path / "apps/hello").rglob("*"))
    assert on_disk <= (64 << 10) + (16 << 10)  # the bound, and the open segment's growth
    kept = [int(t[:2]) for t in texts(tmp_path)]
    assert kept == list(range(kept[0], 60)) and kept[0] > 0  # the newest, without a hole
    assert texts(tmp_path, "quiet") == ["quiet"]
    logdir.stop()


def test_a_torn_last_line_is_no_line_and_a_dead_writers_segment_is_closed_without_it(
    tmp_path: Path, clock: Clock
) -> None:
    folder = tmp_path / "apps/hello/output"
    folder.mkdir(parents=True)
    crashed = folder / f"{int(T0 * 1000):013d}-t1.jsonl"
    whole = encode({"ts": T0, "line": "whole"})
    crashed.write_bytes(whole + b'{"ts": 1800000000.5, "line": "tor')  # SIGKILLed mid-write
    os.utime(crashed, (T0, T0))
    assert texts(tmp_path) == ["whole"]
    logdir = make(tmp_path, clock, "t2", stale_after=60, sweep_every=0)
    clock.now = T0 + 61
    write(logdir, clock.now, "after")
    upkeep(logdir)
    names = files(tmp_path)
    assert not crashed.exists()
    assert any(n.endswith("-t1.jsonl.gz") for n in names)
    assert texts(tmp_path) == ["whole", "after"]
    logdir.stop()


def test_a_write_that_fails_drops_its_lines_counts_them_and_says_so_after(
    tmp_path: Path, clock: Clock
) -> None:
    """A full disk (a small tmpfs, filled): the lines of a write it refuses are dropped and
    counted, none of them half in the file, and the next write that succeeds says so first."""
    with small_filesystem(tmp_path / "small", "256k") as small:
        logdir = make(small, clock)
        assert write(logdir, T0, "one") == 0
        filler = fill(small)
        texts_full = [f"full {i} " + "f" * 60 for i in range(100)]  # less than a page each
        assert write(logdir, T0 + 1, *texts_full) == 100
        assert logdir.metrics.dropped.labels(reason="disk")._value.get() == 100
        assert len(list((small / "apps/hello/output").iterdir())) <= 2  # no empty files
        filler.unlink()  # space again
        assert write(logdir, T0 + 1.5, "lost too") == 1  # a second's pause: no file a write
        clock.now += 2
        assert write(logdir, T0 + 2, "three") == 0
        found = logread.forward(small, "hello", "output", logread.Query())
        assert [(r.get("line") or r.get("wakeful")) for r in map(json.loads, found)] == [
            "one",
            "101 lines lost here: the log directory could not take them",
            "three",
        ]
        logdir.stop()


def test_past_its_backlog_an_append_is_dropped_at_once(tmp_path: Path, clock: Clock) -> None:
    logdir = make(tmp_path, clock, max_pending=100)
    lines = [encode({"ts": T0, "line": "z" * 200})]
    assert logdir.append("hello", "output", lines, T0, T0).result(timeout=1) == 1
    assert logdir.metrics.dropped.labels(reason="backlog")._value.get() == 1
    logdir.stop()


def test_two_writers_on_one_directory_never_write_each_others_files(
    tmp_path: Path, clock: Clock
) -> None:
    """A deposed leader's late appends go to its own segment; the new leader's are whole."""
    alive = {"stale_after": 1e9}  # each writes on (the test's clock is not the files')
    deposed, leader = make(tmp_path, clock, "t1", **alive), make(tmp_path, clock, "t2", **alive)
    for i in range(50):
        write(leader, T0 + i, f"new {i}")
        write(deposed, T0 + i + 0.5, f"late {i}")
    names = files(tmp_path)
    assert len(names) == 2 and {n.split("-")[-1] for n in names} == {"t1.jsonl", "t2.jsonl"}
    found = texts(tmp_path)
    assert sorted(found) == sorted(
        [f"new {i}" for i in range(50)] + [f"late {i}" for i in range(50)]
    )
    assert [t for t in found if t.startswith("new")] == [f"new {i}" for i in range(50)]
    deposed.stop()
    leader.stop()


def test_grep_sandbox_and_version_find_the_lines_that_hold_them(logdir: LogDir) -> None:
    lines = [
        encode({"ts": T0, "sandbox": "sb-1", "version": "v1", "line": 'GET /a "quoted"'}),
        encode({"ts": T0 + 1, "sandbox": "sb-2", "version": "v2", "line": "sb-1 mentioned"}),
        encode({"ts": T0 + 2, "sandbox": "sb-1", "version": "v2", "line": "tab\there"}),
    ]
    logdir.append("hello", "output", lines, T0, T0 + 2).result(timeout=10)
    assert texts(logdir.root, sandbox="sb-1") == ['GET /a "quoted"', "tab\there"]
    assert texts(logdir.root, grep='"quoted"') == ['GET /a "quoted"']
    assert texts(logdir.root, grep="\t") == ["tab\there"]
    assert texts(logdir.root, grep="sb-1") == ["sb-1 mentioned"]  # the text, not the fields
    assert texts(logdir.root, version="v2", sandbox="sb-1") == ["tab\there"]


def test_a_closed_segment_s_file_stays_a_while_for_shippers_and_is_read_once(
    tmp_path: Path, clock: Clock
) -> None:
    """A shipper tailing the open file reads it to its end after the close: the file stays
    `keep_closed` seconds beside its compressed copy, which readers here read instead."""
    logdir = make(tmp_path, clock, segment_bytes=1024, keep_closed=60)
    for i in range(12):
        write(logdir, T0 + i, f"{i:02d} " + "z" * 200)
    names = files(tmp_path)
    closed = [n for n in names if n.endswith(".gz")]
    assert closed and all(n.split("-")[0] + "-t1.jsonl" in names for n in closed)
    starts = {n.split("-")[0] for n in closed}
    still_open = [n for n in names if n.endswith(".jsonl") and n.split("-")[0] not in starts]
    assert [t[:2] for t in texts(tmp_path)] == [f"{i:02d}" for i in range(12)]  # each once
    clock.now += 61
    upkeep(logdir)
    assert [n for n in files(tmp_path) if n.endswith(".jsonl")] == still_open
    logdir.stop()
    again = make(tmp_path, clock, "t2", keep_closed=60)  # a restart finds none to keep
    assert [t[:2] for t in texts(tmp_path)] == [f"{i:02d}" for i in range(12)]
    again.stop()


def test_many_apps_write_through_a_bounded_number_of_open_files(
    tmp_path: Path, clock: Clock
) -> None:
    logdir = make(tmp_path, clock, max_handles=4)
    apps = [f"app-{i:02d}" for i in range(20)]
    for round_ in range(3):
        for app in apps:
            assert write(logdir, T0 + round_, f"{app} {round_}", app=app) == 0
        held = [
            target
            for fd in os.listdir("/proc/self/fd")
            if (target := os.path.realpath(f"/proc/self/fd/{fd}")).startswith(str(tmp_path))
        ]
        assert len(held) <= 4, held
    for app in apps:
        assert texts(tmp_path, app) == [f"{app} {r}" for r in range(3)]
    logdir.stop()


def test_a_read_that_outlives_a_segment_s_close_reads_its_compressed_copy(
    tmp_path: Path, clock: Clock
) -> None:
    """Segments are listed when a read begins; one that closes (its open file removed a
    minute later) before the read reaches it is read from its copy, not skipped."""
    logdir = make(tmp_path, clock, segment_age=3600, keep_closed=60)
    write(logdir, T0, *[f"first {i}" for i in range(10)])
    clock.now += 3600
    upkeep(logdir)  # the first segment closes at its age
    write(logdir, clock.now, *[f"second {i}" for i in range(10)])
    assert len(files(tmp_path)) == 3  # the first, closed (and its file kept), the second
    reading = logread.forward(tmp_path, "hello", "output", logread.Query(since=0))
    got = [next(reading)]  # listed both, reading the first
    clock.now += 3600  # the second closes too, and its open file goes a minute later
    upkeep(logdir)
    clock.now += 61
    upkeep(logdir)
    assert all(name.endswith(".gz") for name in files(tmp_path))
    got += list(reading)
    assert [json.loads(line)["line"] for line in got] == [f"first {i}" for i in range(10)] + [
        f"second {i}" for i in range(10)
    ]
    logdir.stop()


def test_a_segment_another_writer_opens_later_is_found_closed_and_retained(
    tmp_path: Path, clock: Clock
) -> None:
    """A deposed leader may open a segment after the new leader listed the directory: the
    new leader's sweep lists it again, closes it once stale and deletes it by age."""
    logdir = make(tmp_path, clock, "t2", stale_after=60)
    write(logdir, T0, "mine")
    late = tmp_path / "apps/hello/output" / f"{int(T0 * 1000) + 5:013d}-t1.jsonl"
    late.write_bytes(encode({"ts": T0 + 0.005, "line": "late"}))
    os.utime(late, (T0, T0))
    clock.now = T0 + 61
    upkeep(logdir)  # closed: compressed...
    upkeep(logdir)  # ...and its open file removed (no shipper to wait for here)
    assert not late.exists() and texts(tmp_path) == ["mine", "late"]
    assert any(n.endswith("-t1.jsonl.gz") for n in files(tmp_path))
    clock.now = T0 + 86400 * 2  # past the retention: the late segment goes like any other
    upkeep(logdir)
    assert not any("-t1." in n for n in files(tmp_path))
    logdir.stop()


def test_until_finds_a_late_line_and_grep_an_access_line_across_its_fields(
    logdir: LogDir,
) -> None:
    """An access line reaches the log up to a report after its time, so a segment may hold
    lines older than its start: `until` before that start still finds them. And an access
    line's text is its method, path and status: a grep may span them."""

    def access(at: float, method: str, path: str, status: int) -> bytes:
        return encode({"ts": at, "app": "hello", "method": method, "path": path, "status": status})

    late = [access(T0 + 10, "GET", "/early", 200), access(T0 + 6, "POST", "/api/x", 500)]
    assert logdir.append("hello", "access", late, T0 + 10, T0 + 10).result(timeout=10) == 0

    def paths(**query: Any) -> list[str]:
        found = logread.forward(logdir.root, "hello", "access", logread.Query(**query))
        return [json.loads(line)["path"] for line in found]

    assert paths(until=T0 + 8) == ["/api/x"]
    assert paths(grep="POST /api") == ["/api/x"]
    assert paths(grep="/api/x 500") == ["/api/x"]
    assert paths(grep="GET /api") == []


def test_the_directory_over_its_bound_loses_the_oldest_segments_of_any_app(
    tmp_path: Path, clock: Clock
) -> None:
    limits = Limits(retention=86400, max_bytes=48 << 10, app_max_bytes=1 << 30)
    logdir = make(tmp_path, clock, limits=limits, segment_bytes=4096)
    for i in range(40):  # two apps in turn, each line a segment of its own
        write(logdir, T0 + i, f"{i:02d}" + secrets.token_hex(2500), app=f"app-{i % 2}")
    on_disk = sum(p.stat().st_size for p in (tmp_path / "apps").rglob("*") if p.is_file())
    assert on_disk <= 48 << 10
    kept = sorted(int(t[:2]) for app in ("app-0", "app-1") for t in texts(tmp_path, app))
    assert kept == list(range(kept[0], 40)) and kept[0] > 0  # the newest of both, no hole
    logdir.stop()


def test_a_reader_follows_no_link_and_skips_what_is_no_line(tmp_path: Path) -> None:
    """Hand-made damage in the log directory: a link to a file elsewhere is not read through,
    and neither a "line" that is no record nor one longer than any line the writer makes
    reaches an answer; the lines around them do."""
    folder = tmp_path / "apps/hello/output"
    folder.mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text('{"line": "a secret"}\n')
    (folder / f"{int(T0 * 1000):013d}-t9.jsonl").symlink_to(secret)
    damaged = folder / f"{int(T0 * 1000) + 1:013d}-t1.jsonl"
    damaged.write_bytes(
        encode({"ts": T0, "line": "before"})
        + b"root:x:0:0:root:/root:/bin/bash\n"
        + b"y" * (logread.MAX_LINE_BYTES + logread.BLOCK)
        + b"\n"
        + encode({"ts": T0 + 1, "line": "after"})
    )
    assert texts(tmp_path) == ["before", "after"]
