"""The node's side of the suspended tier: the memory its frozen sandboxes hold, and which of
them to give up when that passes the node's cap or the machine runs short (issue 18).

The node only says how much to give up and names its frozen sandboxes, the longest suspended
first (`Node.evict_bytes`, `Node.evict`); the activator stops them in that order, passing
over those that must stay, each with its pool shrunk by one (`wakeful.activator.suspend`), so
nothing replaces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from wakeful.domain.models import Frozen

MEMINFO = Path("/proc/meminfo")


def meminfo(path: Path = MEMINFO) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes."""
    found: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            found[name] = int(rest.split()[0]) * 1024
    return found["MemTotal"], found.get("MemAvailable", found["MemTotal"])


def evictions(
    frozen: Sequence[tuple[float, str, int]], cap: int, pressure: bool
) -> tuple[int, list[Frozen]]:
    """What to give up of the frozen sandboxes, given as (frozen since, id, bytes held): how
    many bytes (what the longest suspended hold, taken until what is left holds at most
    `cap`; under memory pressure, one sandbox more, so each pass gives up one more while it
    lasts), and every frozen sandbox, the longest suspended first, to take them from. The
    activator may have to pass over some (a pool's `min_instances`): it takes the next ones
    then. Nothing to give up: (0, [])."""
    oldest_first = [
        Frozen(sandbox=sandbox_id, memory=size) for _, sandbox_id, size in sorted(frozen)
    ]
    held = sum(sandbox.memory for sandbox in oldest_first)
    taken = 0
    wanted = 0
    for sandbox in oldest_first:
        if held <= cap:
            break
        wanted += sandbox.weight
        held -= sandbox.memory
        taken += 1
    if pressure and taken < len(oldest_first):
        wanted += oldest_first[taken].weight
    return (wanted, oldest_first) if wanted else (0, [])
