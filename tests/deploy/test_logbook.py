"""The control plane's log book: lines to the log directory, retries and gaps, what a restart
keeps, and when it says it is behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from wakeful.deploy import logread
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logdir import LogDir
from wakeful.domain.logbatch import LogBatch, OutputChunk
from wakeful.domain.logfiles import Limits

LIMITS = Limits(retention=86400, max_bytes=1 << 30, app_max_bytes=1 << 28)


class Stream:
    """One sandbox's output as a node would ship it: consecutive byte ranges."""

    def __init__(self, sandbox: str, app: str = "hello", created_at: float = 1.0) -> None:
        self.sandbox, self.app, self.created_at = sandbox, app, created_at
        self.offset = 0

    def chunk(self, text: str, *, finished: bool = False, skip: int = 0) -> OutputChunk:
        """The next `text`, after `skip` bytes the node dropped."""
        self.offset += skip
        data = text.encode()
        chunk = OutputChunk(
            sandbox=self.sandbox,
            app=self.app,
            created_at=self.created_at,
            offset=self.offset,
            size=len(data),
            text=text,
            finished=finished,
        )
        self.offset += len(data)
        return chunk


def batch(*chunks: OutputChunk, node: str = "n1", pending: int = 0) -> LogBatch:
    return LogBatch(node=node, interval=1.0, pending=pending, dropped=0, chunks=list(chunks))


@pytest.fixture
def logdir(tmp_path: Path) -> Iterator[LogDir]:
    found = LogDir(tmp_path / "logs", "t1", LIMITS, sync=False, clock=lambda: 10.0)
    found.start()
    yield found
    found.stop()


def settled(pending: list[Future[int]]) -> None:
    assert [f.result(timeout=10) for f in pending] == [0] * len(pending)


def records(book: LogBook, app: str = "hello", **query: Any) -> list[dict[str, Any]]:
    found = logread.forward(book.logdir.root, app, "output", logread.Query(**query))
    return [json.loads(line) for line in found]


def texts(book: LogBook, app: str = "hello", **query: Any) -> list[str]:
    return [r["line"] for r in records(book, app, **query)]


def test_lines_are_written_as_they_come_and_an_unfinished_one_as_a_piece(
    logdir: LogDir,
) -> None:
    book = LogBook(logdir, clock=lambda: 0.0)
    out = Stream("sb-1")
    settled(book.record(batch(out.chunk("one\ntw")), now=1))
    settled(book.record(batch(out.chunk("o\r\nthr")), now=2))
    settled(book.record(batch(out.chunk("ee\n", finished=True)), now=3))
    found = records(book)
    assert [r["line"] for r in found] == ["one", "tw", "o", "thr", "ee"]
    assert [r.get("more", False) for r in found] == [False, True, False, True, False]
    assert [r["ts"] for r in found] == sorted({r["ts"] for r in found})  # each later
    assert {(r["app"], r["sandbox"], r["node"]) for r in found} == {("hello", "sb-1", "n1")}
    assert [r.get("o") for r in found] == [None, 6, None, 12, 15]  # each chunk's end


def test_an_app_reads_its_own_lines_in_the_order_they_came(logdir: LogDir) -> None:
    book = LogBook(logdir, clock=lambda: 0.0)
    late, early = Stream("sb-late", created_at=20.0), Stream("sb-early", created_at=10.0)
    other = Stream("sb-other", app="other", created_at=5.0)
    settled(book.record(batch(late.chunk("b\n"), other.chunk("x\n")), now=1))
    settled(book.record(batch(early.chunk("a\n"), node="n2"), now=2))
    assert texts(book) == ["b", "a"]
    assert texts(book, sandbox="sb-early") == ["a"]
    assert texts(book, "other") == ["x"]
    assert texts(book, "nope") == []


def test_an_endless_line_is_cut_in_pieces_of_the_bound(logdir: LogDir) -> None:
    book = LogBook(logdir, clock=lambda: 0.0, max_line=8)
    out = Stream("sb-1")
    settled(book.record(batch(out.chunk("abcdefghij\nk\n")), now=1))
    found = records(book)
    assert [(r["line"], r.get("more", False)) for r in found] == [
        ("abcdefgh", True),
        ("ij", False),
        ("k", False),
    ]


def test_past_its_sandbox_bound_the_book_forgets_the_first_finished(logdir: LogDir) -> None:
    book = LogBook(logdir, clock=lambda: 0.0, max_sandboxes=3)
    a, b, c, d = (Stream(f"sb-{n}") for n in "abcd")

    def knows(*ids: str) -> list[bool]:
        return [book.app_of(i) is not None for i in ids]

    book.record(batch(a.chunk("a\n"), b.chunk("b\n"), c.chunk("c\n")), now=1)
    book.record(batch(c.chunk("", finished=True)), now=2)  # c finished before b
    book.record(batch(b.chunk("", finished=True)), now=3)
    book.record(batch(d.chunk("d\n")), now=4)
    assert knows("sb-a", "sb-b", "sb-c", "sb-d") == [True, True, False, True]
    e = Stream("sb-e")
    book.record(batch(e.chunk("e\n")), now=5)
    assert knows("sb-b") == [False]
    book.record(batch(a.chunk("still here\n")), now=6)  # none finished: least recently written
    book.record(batch(Stream("sb-f").chunk("f\n")), now=7)
    assert knows("sb-a", "sb-d", "sb-e", "sb-f") == [True, False, True, True]


def test_a_chunk_sent_again_is_recorded_once_and_a_gap_is_marked(logdir: LogDir) -> None:
    book = LogBook(logdir, clock=lambda: 0.0)
    out = Stream("sb-1")
    first = out.chunk("one\n")
    settled(book.record(batch(first), now=1))
    settled(book.record(batch(first), now=2))  # the answer was lost, the node sent it again
    overlapping = OutputChunk(**{**first.model_dump(), "text": "one\ntwo\n", "size": 8})
    out.offset = 8
    settled(book.record(batch(overlapping), now=3))  # a retry that grew meanwhile
    settled(book.record(batch(out.chunk("four\n", skip=6)), now=4))  # "three\n" dropped
    assert texts(book) == [
        "one",
        "two",
        "[wakeful: 6 bytes of output missing here]",
        "four",
    ]
    assert book.behind("hello", [], now=4) == ["sb-1: 6 bytes missing"]


async def test_a_book_after_a_restart_goes_on_where_the_log_stops(tmp_path: Path) -> None:
    """A new control plane (a restart, a takeover) knows nothing of the streams, but the log
    says how far each got: a node's next chunk is neither a gap nor written twice."""
    first = LogDir(tmp_path, "t1", LIMITS, sync=False)
    first.start()
    out = Stream("sb-1")
    one, again = out.chunk("one\n"), out.chunk("two\n")  # written; the answer was lost
    await LogBook(first).ship(batch(one, again))
    first.stop()
    second = LogDir(tmp_path, "t2", LIMITS, sync=False)
    second.start()
    book = LogBook(second)
    await book.ship(batch(again))
    await book.ship(batch(out.chunk("three\n")))
    assert texts(book) == ["one", "two", "three"]
    assert book.behind("hello", [], now=book.now()) == []
    second.stop()


def test_behind_names_a_quiet_node_one_holding_output_and_one_never_heard_from(
    logdir: LogDir,
) -> None:
    book = LogBook(logdir, clock=lambda: 100.0)
    book.record(batch(node="n1"), now=100)
    book.record(batch(node="n2", pending=4096), now=103)
    assert book.behind("hello", ["n1", "n2"], now=104) == ["n2: 4096 bytes not shipped yet"]
    assert book.behind("hello", ["n1", "n3"], now=104) == []  # the book is new: n3 may come
    assert book.behind("hello", ["n1", "n3"], now=114) == [
        "n1: last batch 14 s ago",
        "n3: no batch received",
    ]
    shipping = book.node("n2")
    assert shipping is not None and shipping.pending == 4096


def test_the_book_holds_a_bounded_number_of_nodes(logdir: LogDir) -> None:
    book = LogBook(logdir, clock=lambda: 0.0, max_nodes=2)
    for now, node in enumerate(["n1", "n2", "n1", "n3"]):
        book.record(batch(node=node), now=now)
    assert [book.node(n) is not None for n in ["n1", "n2", "n3"]] == [True, False, True]


def test_a_batch_is_bounded_and_its_text_cannot_outgrow_its_bytes() -> None:
    with pytest.raises(ValueError, match="more than"):
        LogBatch(
            node="n1",
            interval=1,
            pending=0,
            dropped=0,
            chunks=[Stream(f"sb-{i}").chunk("x" * 200_000) for i in range(2)],
        )
    with pytest.raises(ValueError, match="characters from"):
        OutputChunk(sandbox="sb-1", app="a", created_at=0, offset=0, size=1, text="xx")


async def test_a_batch_is_answered_only_once_its_lines_are_on_disk(tmp_path: Path) -> None:
    """What a node was told is taken survives a SIGKILL of the control plane: when `ship`
    returns, the lines are in the segment file, whole (read straight from the file, with no
    help from the writer)."""
    logdir = LogDir(tmp_path, "t1", LIMITS, sync=True)
    logdir.start()
    book = LogBook(logdir)
    out = Stream("sb-1")
    for i in range(50):
        await book.ship(batch(out.chunk(f"line {i}\n")))
        (segment,) = (tmp_path / "apps/hello/output").iterdir()
        lines = segment.read_bytes().splitlines()
        assert json.loads(lines[-1])["line"] == f"line {i}"
    logdir.stop()


def test_an_access_line_far_from_the_clock_gets_the_clock_s_time(logdir: LogDir) -> None:
    """An ingress's clock far off, or a forged time, must not name a segment in the year
    5000 (never closed, never expired): the line keeps its place, with this clock's time."""
    book = LogBook(logdir, clock=lambda: 10.0)
    line = {"app": "hello", "method": "GET", "path": "/", "status": 200, "bytes": 1, "ms": 1.0}
    book.take_access("edge", [line | {"ts": 9.5}, line | {"ts": 1e11}, line | {"ts": -7.0}])
    logdir.upkeep().result(timeout=10)
    found = logread.forward(logdir.root, "hello", "access", logread.Query())
    assert [json.loads(r)["ts"] for r in found] == [9.5, 10.0, 10.0]
    assert all(n.name.startswith("0000000009500-") for n in logdir.root.glob("apps/*/*/*"))


def test_a_batch_sent_again_before_its_write_landed_waits_for_that_write(
    tmp_path: Path,
) -> None:
    """A slow disk: the node was answered 503 and sends the batch again. Its offsets say it
    was taken, but it is not on disk yet: the retry must wait for that write, not be
    answered at once. (A writer not started yet stands in for one stuck on its disk.)"""
    stuck = LogDir(tmp_path, "t1", LIMITS, sync=False, clock=lambda: 10.0)
    book = LogBook(stuck)
    out = Stream("sb-1")
    sent = batch(out.chunk("one\n"))
    first = book.record(sent, now=1)
    again = book.record(sent, now=2)
    assert len(again) == 1 and again[0] is first[0] and not again[0].done()
    stuck.start()  # the disk answers
    assert again[0].result(timeout=10) == 0
    assert texts(book) == ["one"]  # once
    stuck.stop()
