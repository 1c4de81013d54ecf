"""The control plane's log book: bounds, order, retries and gaps, and when it says it is behind."""

from __future__ import annotations

import pytest

from wakeful.deploy.logbook import LogBook
from wakeful.domain.logbatch import LogBatch, OutputChunk


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


def test_lines_are_assembled_across_chunks_and_the_unfinished_one_is_shown() -> None:
    book = LogBook(clock=lambda: 0.0)
    out = Stream("sb-1")
    book.record(batch(out.chunk("one\ntw")), now=1)
    book.record(batch(out.chunk("o\r\nthr")), now=2)
    assert book.sandbox_lines("sb-1", 10) == ["one", "two", "thr"]
    book.record(batch(out.chunk("ee", finished=True)), now=3)
    assert book.app_lines("hello", 2) == ["[sb-1] two", "[sb-1] three"]


def test_an_app_reads_in_the_order_its_sandboxes_were_created_not_received() -> None:
    book = LogBook(clock=lambda: 0.0)
    late, early = Stream("sb-late", created_at=20.0), Stream("sb-early", created_at=10.0)
    other = Stream("sb-other", app="other", created_at=5.0)
    book.record(batch(late.chunk("b\n"), other.chunk("x\n")), now=1)
    book.record(batch(early.chunk("a\n"), node="n2"), now=2)
    assert book.app_lines("hello", 10) == ["[sb-early] a", "[sb-late] b"]
    assert book.app_lines("nope", 10) == []


@pytest.mark.parametrize(
    ("bounds", "lines", "kept"),
    [
        pytest.param({"max_lines": 3}, ["1", "2", "3", "4", "5"], ["3", "4", "5"], id="lines"),
        pytest.param(
            # each line costs its bytes + a newline: 4 lines of 9 fit in 40
            {"max_bytes": 40},
            [f"line-{i:03d}" for i in range(6)],
            [f"line-{i:03d}" for i in range(2, 6)],
            id="bytes",
        ),
        pytest.param(
            {"max_line": 4}, ["abcdefghij", "k"], ["abcd", "efgh", "ij", "k"], id="long lines wrap"
        ),
    ],
)
def test_a_sandbox_keeps_its_newest_lines_within_its_bounds(
    bounds: dict[str, int], lines: list[str], kept: list[str]
) -> None:
    book = LogBook(clock=lambda: 0.0, **bounds)
    out = Stream("sb-1")
    for line in lines:
        book.record(batch(out.chunk(line + "\n")), now=1)
    assert book.sandbox_lines("sb-1", 100) == kept


def test_an_endless_line_is_wrapped_not_held() -> None:
    book = LogBook(clock=lambda: 0.0, max_line=8, max_lines=4)
    out = Stream("sb-1")
    for _ in range(100):
        book.record(batch(out.chunk("x" * 5)), now=1)  # 500 bytes, no newline
    held = book.sandbox_lines("sb-1", 100)
    assert len(held) <= 5 and all(len(line) <= 8 for line in held)


def test_past_its_sandbox_bound_the_book_forgets_the_first_finished() -> None:
    book = LogBook(clock=lambda: 0.0, max_sandboxes=3)
    a, b, c, d = (Stream(f"sb-{n}") for n in "abcd")
    book.record(batch(a.chunk("a\n"), b.chunk("b\n"), c.chunk("c\n")), now=1)
    book.record(batch(c.chunk("", finished=True)), now=2)  # c finished before b
    book.record(batch(b.chunk("", finished=True)), now=3)
    book.record(batch(d.chunk("d\n")), now=4)
    assert [book.knows(s) for s in ["sb-a", "sb-b", "sb-c", "sb-d"]] == [True, True, False, True]
    e = Stream("sb-e")
    book.record(batch(e.chunk("e\n")), now=5)
    assert not book.knows("sb-b")
    book.record(batch(a.chunk("still here\n")), now=6)  # none finished: least recently written
    book.record(batch(Stream("sb-f").chunk("f\n")), now=7)
    assert [book.knows(s) for s in ["sb-a", "sb-d", "sb-e", "sb-f"]] == [True, False, True, True]


def test_a_chunk_sent_again_is_recorded_once_and_a_gap_is_marked() -> None:
    book = LogBook(clock=lambda: 0.0)
    out = Stream("sb-1")
    first = out.chunk("one\n")
    book.record(batch(first), now=1)
    book.record(batch(first), now=2)  # the answer was lost, the node sent it again
    overlapping = OutputChunk(**{**first.model_dump(), "text": "one\ntwo\n", "size": 8})
    out.offset = 8
    book.record(batch(overlapping), now=3)  # a retry that grew meanwhile
    book.record(batch(out.chunk("four\n", skip=6)), now=4)  # "three\n" dropped on the node
    assert book.sandbox_lines("sb-1", 10) == [
        "one",
        "two",
        "[wakeful: 6 bytes of output missing here]",
        "four",
    ]
    assert book.behind("hello", [], now=4) == ["sb-1: 6 bytes missing"]


def test_behind_names_a_quiet_node_one_holding_output_and_one_never_heard_from() -> None:
    book = LogBook(clock=lambda: 100.0)
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


def test_the_book_holds_a_bounded_number_of_nodes() -> None:
    book = LogBook(clock=lambda: 0.0, max_nodes=2)
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
