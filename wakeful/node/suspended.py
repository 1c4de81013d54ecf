"""The node's side of the suspended tier: the memory its frozen sandboxes hold, and which of
them to give up when that passes the node's cap or the machine runs short (issue 18).

The node only names them (`Node.evict`, the longest suspended first); the activator stops
each with its pool shrunk by one (`wakeful.activator.suspend`), so nothing replaces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def meminfo(path: Path = MEMINFO) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes."""
    found: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            found[name] = int(rest.split()[0]) * 1024
    return found["MemTotal"], found.get("MemAvailable", found["MemTotal"])


def evictions(frozen: Sequence[tuple[float, str, int]], cap: int, pressure: bool) -> list[str]:
    """Which frozen sandboxes, given as (frozen since, id, bytes held), to stop: the longest
    suspended first, until what is left holds at most `cap`; under memory pressure, one more
    than that (each pass gives up one more while the pressure lasts)."""
    oldest_first = sorted(frozen)
    held = sum(size for _, _, size in frozen)
    chosen = []
    for _, sandbox_id, size in oldest_first:
        if held <= cap:
            break
        chosen.append(sandbox_id)
        held -= size
    if pressure and len(chosen) < len(oldest_first):
        chosen.append(oldest_first[len(chosen)][1])
    return chosen
