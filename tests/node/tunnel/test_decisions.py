"""Table tests of the tunnel client's rules (`wakeful/node/tunnel/decisions.py`): when the
coverage table is written to the node record, and what a refused stream means for the next."""

from __future__ import annotations

import pytest

from wakeful.domain.models import ReplicaCoverage, Tunnel
from wakeful.node.tunnel.decisions import (
    PUBLISH_EVERY,
    OpenFailure,
    open_failure,
    worth_publishing,
)


def table(*replicas: tuple[str, int, int, str], reachable: bool = True) -> Tunnel:
    """A table of (replica, streams, busy, state)."""
    return Tunnel(
        reachable=reachable,
        replicas=[
            ReplicaCoverage(replica=r, streams=s, busy=b, budget=8, state=state)
            for r, s, b, state in replicas
        ],
    )


R1 = ("r1", 4, 1, "steady")
NOW = 100.0


@pytest.mark.parametrize(
    ("last", "new", "published_at", "expected"),
    [
        pytest.param(None, table(R1), NOW, True, id="nothing written yet: written at once"),
        pytest.param(
            table(R1), table(R1), NOW - 60, False, id="the same table: never written again"
        ),
        pytest.param(
            table(R1),
            table(("r1", 4, 3, "steady")),
            NOW - 1,
            False,
            id="only busy counts changed, 1 s after the last write: waits",
        ),
        pytest.param(
            table(R1),
            table(("r1", 4, 3, "steady")),
            NOW - PUBLISH_EVERY,
            True,
            id="only busy counts changed, PUBLISH_EVERY after the last write: written",
        ),
        pytest.param(
            table(R1),
            table(("r1", 5, 1, "steady")),
            NOW,
            True,
            id="a replica's stream count changed: written at once",
        ),
        pytest.param(
            table(R1),
            table(("r1", 4, 1, "evacuate")),
            NOW,
            True,
            id="a replica's state changed: written at once",
        ),
        pytest.param(
            table(R1),
            table(R1, ("r2", 1, 0, "fill")),
            NOW,
            True,
            id="a replica appeared: written at once",
        ),
        pytest.param(
            table(R1),
            table(R1, reachable=False),
            NOW,
            True,
            id="reachability changed: written at once",
        ),
    ],
)
def test_worth_publishing(
    last: Tunnel | None, new: Tunnel, published_at: float, expected: bool
) -> None:
    assert worth_publishing(last, new, NOW, published_at) is expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(503, OpenFailure.FOR_NOW, id="503, a full or starting replica: no pause"),
        pytest.param(401, OpenFailure.REFUSED, id="401, the token unknown: pause, an error"),
        pytest.param(403, OpenFailure.REFUSED, id="403, the token refused: pause, an error"),
        pytest.param(502, OpenFailure.FAILED, id="502 from the balancer: pause"),
        pytest.param(None, OpenFailure.FAILED, id="no answer at all: pause"),
    ],
)
def test_open_failure(status: int | None, expected: OpenFailure) -> None:
    assert open_failure(status) is expected
