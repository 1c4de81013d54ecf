"""The ingress supervisor's rules (`ingress.workers`), pure: when a worker is started again
and when one is taken for hung, and what each worker is given of the settings it shares."""

from __future__ import annotations

from wakeful.ingress.settings import join_address, split_address

RESTART_FIRST = 1.0
RESTART_MAX = 30.0
STEADY = 60.0
"""A worker that ran this long is restarted after RESTART_FIRST again."""
HUNG = 30.0
"""Seconds a worker that was ready may go without answering its /readyz at all (no answer
within a second, or no connection; a 503 while it drains is an answer) before it is killed
and started again: a stopped or deadlocked process keeps its share of the port's new
connections, which the kernel goes on giving it."""


def hung(silent_since: float | None, now: float) -> bool:
    """Whether a worker silent since `silent_since` (None: answering, or never ready since
    it started) has been so for `HUNG` seconds."""
    return silent_since is not None and now - silent_since >= HUNG


def restart_pause(last: float | None, ran: float) -> float:
    """Seconds before a worker that exited is started again: RESTART_FIRST the first time
    (`last` None) or after it ran STEADY seconds; else the last pause doubled, at most
    RESTART_MAX."""
    if last is None or ran >= STEADY:
        return RESTART_FIRST
    return min(last * 2, RESTART_MAX)


def shifted(address: str, by: int) -> str:
    """`host:port` with the port moved up by `by` (a port 0 stays 0: each worker's own)."""
    host, port = split_address(address)
    return join_address(host, port + by if port else 0)


def share(total: int, workers: int, index: int) -> int:
    """Worker `index`'s part of `total` split among `workers`: as even as whole numbers
    allow, the parts adding up to `total`, and at least 1."""
    return max(1, total // workers + (index < total % workers))
