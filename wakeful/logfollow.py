"""What `wakeful logs -f` prints on each poll: only the lines it has not printed yet.

The control API answers with a window, the last N lines of each of the app's sandboxes,
`[sandbox-id] `-prefixed, and has no cursor. So the new lines are found by overlap, per
sandbox: the longest end of the previous window that the new window starts with was printed
already, and what follows it is new. (Comparing whole windows, or only their starts, prints
the whole window again on every poll once a sandbox has more than N lines: the window slides.)

Limits, since a line carries no position: when a sandbox's window is one line repeated, new
copies of it cannot be told from old ones (they count as old); lines that scroll past the
window between two polls (more than N in one poll interval) are never seen. A last line that
was still being written (no newline yet) and has grown since is printed again, whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def split_line(line: str) -> tuple[str, str]:
    """`("sb-1", "text")` of `[sb-1] text`; `("", line)` for a line without the prefix. A
    sandbox id holds no `]`, so the first `] ` ends the prefix whatever the text holds."""
    if line.startswith("["):
        sandbox, sep, text = line[1:].partition("] ")
        if sep:
            return sandbox, text
    return "", line


def sandbox_of(line: str) -> str:
    """`sb-1` of `[sb-1] text`; "" for a line without the prefix."""
    return split_line(line)[0]


def by_sandbox(lines: Sequence[str]) -> dict[str, list[str]]:
    """Each sandbox's lines, the sandboxes in the order they first appear."""
    windows: dict[str, list[str]] = {}
    for line in lines:
        windows.setdefault(sandbox_of(line), []).append(line)
    return windows


def _overlaps(window: Sequence[str], previous: Sequence[str]) -> Iterator[int]:
    """Every k for which `previous` ends with `window[:k]`, longest first, 0 last.

    Knuth-Morris-Pratt over lines, so a window of 10,000 near-identical lines (an access log)
    costs linear time, not quadratic."""
    fail = [0] * len(window)  # fail[i]: the longest proper border of window[: i + 1]
    k = 0
    for i in range(1, len(window)):
        while k and window[i] != window[k]:
            k = fail[k - 1]
        if window[i] == window[k]:
            k += 1
        fail[i] = k
    k = 0
    for line in previous:
        while k and (k == len(window) or line != window[k]):
            k = fail[k - 1]
        if k < len(window) and line == window[k]:
            k += 1
    while k:
        yield k
        k = fail[k - 1]
    yield 0


def unseen(previous: Sequence[str], window: Sequence[str]) -> list[str]:
    """The lines of one sandbox's new `window` not in its `previous` one: those after the
    longest end of `previous` that `window` starts with. When `previous` ended in a line still
    being written, and `window` has it longer at that place, that line counts as unseen."""
    if not previous:
        return list(window)
    exact = next(_overlaps(window, previous))
    grown = 0
    last = previous[-1]
    if last:  # a line being written is never empty
        for k in _overlaps(window, previous[:-1]):
            if k < len(window) and window[k] != last and window[k].startswith(last):
                grown = k + 1
                break
    return list(window[grown - 1 :] if grown > exact else window[exact:])


class LogFollower:
    """Remembers each sandbox's last window; `take` returns what a new answer adds."""

    def __init__(self) -> None:
        self._windows: dict[str, list[str]] = {}

    def take(self, lines: Sequence[str]) -> list[str]:
        windows = by_sandbox(lines)
        fresh = [
            line
            for sandbox, window in windows.items()
            for line in unseen(self._windows.get(sandbox, []), window)
        ]
        self._windows = windows
        return fresh
