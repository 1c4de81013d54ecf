"""The tunnel client's rules beside the sizing (`wakeful.domain.coverage`): when the coverage
table is worth writing to the node record, and what a stream that could not open means for
the next one. No I/O, no clock reads: `TunnelClient` passes `now` and the refusal's status.
"""

from __future__ import annotations

import enum
from typing import Any

from wakeful.domain.models import Tunnel

PUBLISH_EVERY = 5.0
"""Busy counts change with every call: the table is rewritten at most this often unless a
replica's streams or state, or reachability, changed."""


def shape(table: Tunnel) -> tuple[Any, ...]:
    """What makes a table worth publishing at once: reachability, replicas, their streams
    and states (busy counts alone wait for PUBLISH_EVERY)."""
    return (
        table.reachable,
        tuple((r.replica, r.streams, r.state) for r in table.replicas),
    )


def worth_publishing(last: Tunnel | None, table: Tunnel, now: float, published_at: float) -> bool:
    """Write `table` now, `last` being the table written last (None: none yet), at
    `published_at`: at once when its shape changed, else when anything changed and the last
    write is `PUBLISH_EVERY` seconds old."""
    if last is None or shape(last) != shape(table):
        return True
    return last != table and now - published_at >= PUBLISH_EVERY


class OpenFailure(enum.Enum):
    """What a stream that could not open means for the next."""

    FOR_NOW = "refused for now"
    """503: the replica the balancer chose is full for this node, or starting. The next stream
    may land elsewhere, and coverage decides how many to try: no pause."""
    REFUSED = "refused"
    """401, 403: the node's token is not taken. Opens pause (backing off), logged as an error:
    an operator must act."""
    FAILED = "failed"
    """Anything else (no answer, another status, a broken hello): opens pause, backing off."""


def open_failure(status: int | None) -> OpenFailure:
    """`status`: the HTTP status the upgrade was refused with; None when there was none."""
    if status == 503:
        return OpenFailure.FOR_NOW
    if status in (401, 403):
        return OpenFailure.REFUSED
    return OpenFailure.FAILED
