"""What `wakeful logs -f` prints on each poll: the lines a sandbox's new window adds to the
one printed before, found by overlap because the control API's windows carry no cursor."""

from __future__ import annotations

import random

import pytest

from wakeful.logfollow import LogFollower, sandbox_of, split_line, unseen


def lines(text: str) -> list[str]:
    return text.split() if text else []


@pytest.mark.parametrize(
    ("previous", "window", "fresh"),
    [
        ("", "a b c", "a b c"),
        ("a b", "a b c d", "c d"),
        ("a b c", "b c d", "d"),
        ("a b c", "d e f", "d e f"),
        ("a b c", "c d e", "d e"),
        ("x a a", "a a a", "a"),
        ("a a a", "a a a", ""),
        ("a b c", "a b c", ""),
        ("a b hel", "b hello c", "hello c"),
        ("a b hel", "a b hel", ""),
        ("a b c", "", ""),
    ],
    ids=[
        "the first window is all new",
        "a window not yet full grows at its end",
        "a full window slides: only the line that came in is new",
        "more than a window arrived between two polls: all of it is new",
        "only the last line was seen before",
        "a repeated line after another is found by the longest overlap",
        "a window of one repeated line cannot show new copies of it",
        "nothing happened",
        "a line still being written has grown: printed again, whole",
        "a line still being written that has not grown is not new",
        "the sandbox's log is gone",
    ],
)
def test_only_what_follows_the_overlap_with_the_previous_window_is_new(
    previous: str, window: str, fresh: str
) -> None:
    assert unseen(lines(previous), lines(window)) == lines(fresh)


def longest_overlap_by_brute_force(previous: list[str], window: list[str]) -> int:
    for k in range(min(len(previous), len(window)), 0, -1):
        if previous[len(previous) - k :] == window[:k]:
            return k
    return 0


def test_the_overlap_is_the_longest_one_on_near_identical_lines() -> None:
    """An access log is mostly one line: the linear-time search agrees with the obvious one.
    (Lines of one character: none is another one grown.)"""
    rng = random.Random(7)
    for _ in range(2000):
        previous = [rng.choice("aab") for _ in range(rng.randint(1, 12))]
        window = [rng.choice("aab") for _ in range(rng.randint(0, 12))]
        k = longest_overlap_by_brute_force(previous, window)
        assert unseen(previous, window) == window[k:], (previous, window)


def test_an_access_log_of_ten_thousand_lines_is_followed_in_linear_time() -> None:
    previous = [*["GET / 200"] * 9_999, "GET /x 404"]
    window = [*previous[1:], "GET / 200"]
    assert unseen(previous, window) == ["GET / 200"]


@pytest.mark.parametrize(
    ("line", "sandbox", "text"),
    [
        ("[sb-1] hello", "sb-1", "hello"),
        ("[sb-1]hello", "", "[sb-1]hello"),
        ("hello", "", "hello"),
        ("[sb-2] [x] y", "sb-2", "[x] y"),
        ("[sb-3] ", "sb-3", ""),
    ],
    ids=["prefixed", "no space", "no prefix", "brackets in the text", "empty line"],
)
def test_a_line_names_its_sandbox_in_its_prefix(line: str, sandbox: str, text: str) -> None:
    assert sandbox_of(line) == sandbox
    assert split_line(line) == (sandbox, text)


def test_each_sandbox_is_followed_on_its_own() -> None:
    follower = LogFollower()
    first = ["[a] 1", "[a] 2", "[b] 1"]
    assert follower.take(first) == first
    # a's window slid by one, b wrote two lines, c started
    second = ["[a] 2", "[a] 3", "[b] 1", "[b] 2", "[b] 3", "[c] 1"]
    assert follower.take(second) == ["[a] 3", "[b] 2", "[b] 3", "[c] 1"]
    assert follower.take(second) == []
    # b's log went away and came back with the same lines: it is printed again
    assert follower.take(["[a] 2", "[a] 3"]) == []
    assert follower.take(["[a] 2", "[a] 3", "[b] 3"]) == ["[b] 3"]
