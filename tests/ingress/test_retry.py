"""Invariant 11 as a table (`retry.next_attempt`): a request is sent again only when nothing
reached an app, or when an idempotent request without a body found its connection closed
before any answer; never more often than the bounds say."""

from __future__ import annotations

import pytest

from wakeful.ingress.errors import (
    ClosedUnanswered,
    ConnectFailed,
    UpstreamError,
    UpstreamFailed,
    UpstreamTimeout,
)
from wakeful.ingress.retry import Body, Next, next_attempt

REFUSED = ConnectFailed("could not connect to 10.0.0.5:8080: refused")
UNANSWERED = ClosedUnanswered("the connection closed before any answer")
UNANSWERED_NEW = ClosedUnanswered("the connection closed before any answer", on_new=True)
BROKEN = UpstreamFailed("the sandbox closed the connection mid-answer")
SILENT = UpstreamTimeout("the sandbox stayed silent for 30 s")
AGAIN, ELSEWHERE, GIVE_UP = Next.AGAIN, Next.ELSEWHERE, Next.GIVE_UP
AGAIN_LATER = Next.AGAIN_LATER


@pytest.mark.parametrize(
    ("failure", "method", "body", "elsewhere", "again", "expected"),
    [
        # -- nothing reached the sandbox: another one, within the bound ----------------------
        pytest.param(REFUSED, "GET", Body.NONE, 0, 0, ELSEWHERE, id="refused: elsewhere"),
        pytest.param(REFUSED, "POST", Body.NONE, 0, 0, ELSEWHERE, id="refused POST: elsewhere"),
        pytest.param(
            REFUSED, "POST", Body.KEPT, 1, 0, ELSEWHERE, id="refused with a kept body: elsewhere"
        ),
        pytest.param(
            REFUSED, "PUT", Body.SPENT, 0, 0, GIVE_UP, id="refused after the body streamed on"
        ),
        pytest.param(REFUSED, "GET", Body.NONE, 2, 0, GIVE_UP, id="refused past the bound"),
        pytest.param(
            REFUSED, "GET", Body.NONE, 1, 1, ELSEWHERE, id="refused on the resend: elsewhere"
        ),
        # -- the connection closed before any answer: once more, same sandbox ----------------
        pytest.param(UNANSWERED, "GET", Body.NONE, 0, 0, AGAIN, id="unanswered GET: again"),
        pytest.param(UNANSWERED, "HEAD", Body.NONE, 0, 0, AGAIN, id="unanswered HEAD: again"),
        pytest.param(UNANSWERED, "OPTIONS", Body.NONE, 0, 0, AGAIN, id="unanswered OPTIONS: again"),
        pytest.param(UNANSWERED, "PUT", Body.NONE, 0, 0, AGAIN, id="unanswered PUT: again"),
        pytest.param(UNANSWERED, "DELETE", Body.NONE, 0, 0, AGAIN, id="unanswered DELETE: again"),
        pytest.param(UNANSWERED, "TRACE", Body.NONE, 0, 0, AGAIN, id="unanswered TRACE: again"),
        pytest.param(UNANSWERED, "GET", Body.NONE, 0, 1, GIVE_UP, id="unanswered twice: give up"),
        pytest.param(
            UNANSWERED, "POST", Body.NONE, 0, 0, GIVE_UP, id="unanswered POST: never again"
        ),
        pytest.param(
            UNANSWERED, "PATCH", Body.NONE, 0, 0, GIVE_UP, id="unanswered PATCH: never again"
        ),
        pytest.param(
            UNANSWERED,
            "PUT",
            Body.KEPT,
            0,
            0,
            GIVE_UP,
            id="unanswered PUT with a body: never again, even kept whole",
        ),
        pytest.param(
            UNANSWERED, "GET", Body.NONE, 1, 0, AGAIN, id="unanswered on a second sandbox: again"
        ),
        # -- ... on a connection that had carried nothing: once more, after a pause ----------
        pytest.param(
            UNANSWERED_NEW, "GET", Body.NONE, 0, 0, AGAIN_LATER, id="new connection shut: later"
        ),
        pytest.param(
            UNANSWERED_NEW, "GET", Body.NONE, 0, 1, GIVE_UP, id="new connection shut twice"
        ),
        pytest.param(
            UNANSWERED_NEW, "POST", Body.NONE, 0, 0, GIVE_UP, id="new connection shut, POST"
        ),
        # -- an answer begun and broken, or silence: the failure is the answer ---------------
        pytest.param(BROKEN, "GET", Body.NONE, 0, 0, GIVE_UP, id="broken mid-answer: give up"),
        pytest.param(SILENT, "GET", Body.NONE, 0, 0, GIVE_UP, id="silent: give up"),
    ],
)
def test_next_attempt(
    failure: UpstreamError, method: str, body: Body, elsewhere: int, again: int, expected: Next
) -> None:
    step = next_attempt(
        failure, method=method, body=body, elsewhere=elsewhere, again=again, bound=2
    )
    assert step is expected


def test_no_retries_when_the_bound_is_zero() -> None:
    step = next_attempt(REFUSED, method="GET", body=Body.NONE, elsewhere=0, again=0, bound=0)
    assert step is GIVE_UP
