"""`Marks`: how far each of several holders says it has come (a store revision it has
followed), and a wait until every one has reached a mark.

The control plane keeps one for the ingresses' routes (`Leases.routes`): each ingress says
the revision of `apps/` its routing table has followed, on its lease channel or in-process,
and a deploy waits until all of them route what it wrote (`GET /v1/apps/{app}/routed`). A
holder is whatever reports (a channel, an in-process client), forgotten when it goes: one
that left never holds a wait up. Marks only move on: a lower one than a holder said before
changes nothing.
"""

from __future__ import annotations

import anyio


class Marks:
    """The mark each holder has reached, by holder, with the name it reports under."""

    def __init__(self) -> None:
        self._marks: dict[object, tuple[str, int]] = {}
        self._moved = anyio.Event()

    def saw(self, holder: object, name: str, mark: int) -> None:
        """`holder`, called `name`, has reached `mark`."""
        known = self._marks.get(holder)
        if known is not None and known[1] >= mark and known[0] == name:
            return
        self._marks[holder] = (name, mark if known is None else max(mark, known[1]))
        self._wake()

    def gone(self, holder: object) -> None:
        if self._marks.pop(holder, None) is not None:
            self._wake()

    def __len__(self) -> int:
        return len(self._marks)

    def behind(self, mark: int) -> dict[str, int]:
        """Who has not reached `mark`, by name, with the lowest mark a holder of that name
        has reached (one ingress's old channel, not closed yet, beside its new one)."""
        late: dict[str, int] = {}
        for name, reached in self._marks.values():
            if reached < mark:
                late[name] = min(reached, late.get(name, reached))
        return late

    async def wait(self, mark: int, within: float) -> dict[str, int]:
        """Until every holder has reached `mark` (one that goes meanwhile is left out), for
        at most `within` seconds: who is behind then (empty: nobody)."""
        with anyio.move_on_after(within):
            while self.behind(mark):
                await self._moved.wait()
        return self.behind(mark)

    def _wake(self) -> None:
        self._moved.set()
        self._moved = anyio.Event()
