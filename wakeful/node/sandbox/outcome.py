"""How a sandbox's end is recorded: the lifecycle event and the `last_log` a person reads.
No I/O: `SandboxRunner._report` reads the record and the process's output, asks, and writes.

- Asked to stop (its record is `stopping`): `stopped`, with its last lines.
- Otherwise it is `dead`: with its last lines; when it never got ready, with why first: "not
  ready on port P within N s" when its health timeout ran out while it ran (whatever it said,
  it did not crash), "exited with N before it was ready" when it ended and said nothing; and,
  when another process answered on its port, with that first, since its own lines do not
  explain it.
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
    gave_up: bool = False,
    exit_code: int | None = None,
) -> tuple[Transition, str]:
    """(event, last_log). `stopping`: its record asked it to stop; `ready`: it was ever ready;
    `squatted`: another process answered on its `port`; `tail`: `last_lines`; `timeout`: its
    health check's; `gave_up`: that ran out while it still ran; `exit_code`: its own."""
    if stopping:
        return Transition.STOPPED, tail
    if squatted:
        return Transition.FAIL, f"port {port} answered, but not from this sandbox\n{tail}"
    if ready:
        return Transition.FAIL, tail
    if gave_up:
        return Transition.FAIL, last_lines(tail, f"not ready on port {port} within {timeout:g} s")
    ended = "" if exit_code is None else f"exited with {exit_code} before it was ready"
    return Transition.FAIL, tail or ended or f"not ready within {timeout:g} s"
