"""`Marks`: how far each of several named holders says it has come (a store revision it has
followed), and a wait until every one has reached a mark.

The control plane keeps one for the ingresses' routes (`Leases.routes`): each ingress says
the revision of `apps/` its routing table has followed, on its lease channel or in-process,
and a deploy waits until all of them route what it wrote (`GET /v1/apps/{app}/routed`). The
rules, each for a way a wait could end before the ingresses route the app:

- **A name is one ingress**, within a scope (the token its channel was opened with: one
  token's holder cannot stand for another's), and within the instance it says it is (a
  process's random id: `ChannelLeases` sends one; the in-process client and an older ingress
  send none). A holder is whatever reports (a channel, an in-process client); a new holder
  of the same instance (the ingress's next channel) replaces the one before, whose close may
  not have been noticed yet.
- **Two live instances of one name are two ingresses** (two machines of one short hostname
  both default to `host-port`): each counts from its first report, shown as `NAME (INSTANCE)`
  while both are there, and `saw` returns that name once, at the second's first report, for
  the caller to warn (their tunnels would collide as well; a holder that changes its id
  later is not warned of again). An instance that comes back while its last holder still
  lingers (its channel was lost) is the same ingress, not a second. A new instance of a
  name that only lingers (an ingress restarted) takes its place.
- **A holder lost lingers.** When a holder goes without saying it stops (a channel lost), its
  name and mark still count for `linger` seconds, so that a wait does not end because the
  ingress that was behind lost its channel; its next holder takes over, and a name that
  never comes back stops counting after them.
- **A holder that stops is forgotten at once** (`gone(linger=False)`: a draining ingress).
- **A newcomer settles first.** For `settle` seconds after it is made (a control plane that
  has just taken over, whose ingresses are still finding it), a wait lasts at least until
  then before it judges; `settle` starts that again (when the control API begins to listen,
  with 0 where nothing took over, `wakeful up`).
- **Marks only move on**: a lower one than a holder said before changes nothing.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

import anyio

LINGER = 5.0
SETTLE = 3.0
Key = tuple[str, str, str]
"""(scope, name, instance)."""


class Marks:
    def __init__(
        self,
        linger: float = LINGER,
        settle: float = SETTLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._linger = linger
        self._settled_at = clock() + settle
        self._marks: dict[object, tuple[Key, int]] = {}
        """By holder: (its key, the mark it has reached)."""
        self._holder_of: dict[Key, object] = {}
        self._left: dict[Key, tuple[int, float]] = {}
        """Keys whose holder was lost: (mark, until when it still counts)."""
        self._moved = anyio.Event()
        self.waiting = 0
        """Waits under way."""

    def settle(self, seconds: float) -> None:
        """Waits judge only `seconds` from now (0: at once)."""
        self._settled_at = self._clock() + seconds

    def saw(
        self, holder: object, name: str, mark: int, scope: str = "", instance: str = ""
    ) -> str | None:
        """`holder`, ingress `instance` called `name` within `scope`, has reached `mark`.
        Returns the name it is shown under when this report is the first of a second live
        instance of `name` (else None)."""
        key = (scope, name, instance)
        known = self._marks.get(holder)
        if known is not None and known[0] == key:
            if known[1] >= mark:
                return None
        elif known is not None:  # renamed: the old name goes with no linger
            self._forget(holder, known[0])
        twin = None
        before = self._holder_of.get(key)
        if before is not None and before != holder:
            del self._marks[before]  # the ingress's older channel
        elif before is None and key not in self._left:  # an instance new to this name
            for other in [k for k in self._left if k[:2] == key[:2]]:
                del self._left[other]  # a restarted ingress takes a lost one's place
            if known is None and any(k[:2] == key[:2] for k in self._holder_of):
                twin = key  # said at a holder's first report alone: one flipping ids says once
        self._holder_of[key] = holder
        self._left.pop(key, None)
        self._marks[holder] = (key, mark)
        self._wake()
        return None if twin is None else _shown(twin, self._counted())

    def gone(self, holder: object, *, linger: bool = True) -> None:
        """`holder` went: its mark lingers (`linger`), or is forgotten at once."""
        self._expire()
        known = self._marks.pop(holder, None)
        if known is None:
            return
        key, mark = known
        self._forget(holder, key)
        if linger:
            self._left[key] = (mark, self._clock() + self._linger)
        self._wake()

    def _forget(self, holder: object, key: Key) -> None:
        if self._holder_of.get(key) == holder:
            del self._holder_of[key]

    def __len__(self) -> int:
        """Names that count: held, or lingering."""
        self._expire()
        return len(self._holder_of) + len(self._left)

    def behind(self, mark: int) -> dict[str, int]:
        """Who has not reached `mark`, by the name each is shown under, with the mark each
        has reached (the lowest of one name's in several scopes)."""
        self._expire()
        late: dict[str, int] = {}
        found = [(key, reached) for key, reached in self._marks.values()]
        found += [(key, reached) for key, (reached, _) in self._left.items()]
        counted = self._counted()
        for key, reached in found:
            if reached < mark:
                shown = _shown(key, counted)
                late[shown] = min(reached, late.get(shown, reached))
        return late

    def _counted(self) -> collections.Counter[tuple[str, str]]:
        """How many instances of each (scope, name) count."""
        return collections.Counter(key[:2] for key in (*self._holder_of, *self._left))

    async def wait(self, mark: int, within: float) -> dict[str, int]:
        """Until every name has reached `mark`, for at most `within` seconds: who is behind
        then (empty: nobody)."""
        self.waiting += 1
        try:
            with anyio.move_on_after(within):
                await anyio.sleep(max(0.0, self._settled_at - self._clock()))
                while self.behind(mark):
                    ends = [until for reached, until in self._left.values() if reached < mark]
                    pause = min(ends) - self._clock() if ends else math.inf
                    with anyio.move_on_after(max(0.0, pause)):
                        await self._moved.wait()
        finally:
            self.waiting -= 1
        return self.behind(mark)

    def _expire(self) -> None:
        now = self._clock()
        for key in [key for key, (_, until) in self._left.items() if until <= now]:
            del self._left[key]

    def _wake(self) -> None:
        self._moved.set()
        self._moved = anyio.Event()


def _shown(key: Key, counted: collections.Counter[tuple[str, str]]) -> str:
    """`key`'s name, with its instance when another instance of the name counts too."""
    scope, name, instance = key
    return f"{name} ({instance or 'no id'})" if counted[scope, name] > 1 else name
