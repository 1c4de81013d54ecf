"""How a sandbox's end is recorded: the lifecycle event and the `last_log` a person reads.
No I/O: `SandboxRunner._report` reads the record and the process's output, asks, and writes.

- Asked to stop (its record is `stopping`): `stopped`, with its last lines.
- Otherwise it is `dead`: with its last lines; with "not ready within N s" when it never got
  ready and said nothing; and, when another process answered on its port, with that first,
  since its own lines do not explain it.
- The runtime's own reason (out of memory, say) comes before the last lines.
"""

from __future__ import annotations

from wakeful.domain.lifecycle import Transition


def last_lines(tail: str, reason: str | None) -> str:
    """The output's last lines, after `reason` when the runtime knows why it ended."""
    if reason is None:
        return tail
    return f"{reason}\n{tail}" if tail else reason


def ending(
    *,
    stopping: bool,
    ready: bool,
    squatted: bool,
    tail: str,
    timeout: float,
    port: int,
) -> tuple[Transition, str]:
    """(event, last_log). `stopping`: its record asked it to stop; `ready`: it was ever ready;
    `squatted`: another process answered on its `port`; `tail`: `last_lines`; `timeout`: its
    health check's."""
    if stopping:
        return Transition.STOPPED, tail
    reason = tail if ready else (tail or f"not ready within {timeout:g} s")
    if squatted:
        reason = f"port {port} answered, but not from this sandbox\n{tail}"
    return Transition.FAIL, reason
