"""The node's side of the suspended tier: the memory its frozen sandboxes hold, and which of
them to give up when that passes the node's cap or the machine runs short (issue 18).

The node only says how much to give up and names its frozen sandboxes, the longest suspended
first (`Node.evict_bytes`, `Node.evict`); the activator stops them in that order, passing
over those that must stay, each with its pool shrunk by one (`wakeful.activator.evict`), so
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
    many bytes (what they hold past `cap`; under memory pressure, 1 more, so that each pass
    gives up at least one sandbox while it lasts), and every frozen sandbox, the longest
    suspended first, to take them from. The activator stops them in that order until what
    they held adds up to it, passing over those that must stay (a pool's `min_instances`):
    the bytes, not the first sandboxes' sizes, so one big pinned sandbox at the head does
    not make it stop that much of the others. Nothing to give up: (0, [])."""
    oldest_first = [
        Frozen(sandbox=sandbox_id, memory=size) for _, sandbox_id, size in sorted(frozen)
    ]
    wanted = max(0, sum(sandbox.memory for sandbox in oldest_first) - cap)
    if pressure and oldest_first:
        wanted += 1
    return (wanted, oldest_first) if wanted else (0, [])
