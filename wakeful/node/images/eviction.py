"""Which unpacked trees make room for a new one: a pure decision of the cache's state.

Rules: a tree a sandbox holds (`in_use`) is never chosen; of the rest, the least recently
used goes first, and no more go than the room needs. When even every unused tree is not
enough, nothing is chosen (`None`): the caller refuses the new image rather than pass the
bound or take a running sandbox's tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Held:
    """A tree as the decision sees it: `size` is its files' bytes, `last_used` a tick of the
    cache's own counter (a larger one is more recent)."""

    key: str
    size: int
    last_used: int
    in_use: bool


def to_evict(trees: Sequence[Held], used: int, need: int, budget: int) -> list[str] | None:
    """The keys to remove, least recently used first, so that `used - freed + need` is
    within `budget`; `[]` when it already is, `None` when it cannot be."""
    if used + need <= budget:
        return []
    chosen: list[str] = []
    freed = 0
    for tree in sorted((t for t in trees if not t.in_use), key=lambda t: t.last_used):
        chosen.append(tree.key)
        freed += tree.size
        if used - freed + need <= budget:
            return chosen
    return None
