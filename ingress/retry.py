"""Whether a request that failed on its way to a sandbox is sent again, and where (invariant 11).

The rule that keeps this correct: **nothing that may have reached an app is sent twice,
except an idempotent request with no body whose connection ended before any byte of the
answer.** So:

- nothing reached the sandbox (`ConnectFailed`: refused, unreachable, a tunnel's node could
  not reach it): try another sandbox, at most `bound` times (`WAKEFUL_CONNECT_RETRIES`), and
  only while the body can be sent again (none, or no more of it read than `preread`
  kept);
- the request went out and the connection closed or reset before any byte of the answer
  (`ClosedUnanswered`: the keep-alive race, a sandbox that died mid-request): send it once
  more, to the same sandbox on a fresh connection, when its method is idempotent (RFC 9110
  §9.2.2) and it has no body; nginx's `proxy_next_upstream error` does the same. When the
  connection that closed was new (it had carried no request before: no keep-alive race),
  the sandbox shut a connection it had just taken, as an app with a thread per connection
  does when it has no thread left (a burst, and our own pooled connections hold threads
  too): the resend waits `RESEND_PAUSE`, then takes a pooled connection if one is idle by
  then (its thread is there already), else a new one;
- anything else (an answer begun and broken, silence, a bad answer): give up.

What failed, and how far the exchange got, is the error's type: the upstream transport
translates every failure into one of `ingress.errors` at its boundary. On GIVE_UP the failure
itself is the answer (the edge maps it: 502, or 504 for silence).

A pure function: `Proxy.open` (`ingress/proxy.py`) is its one caller and carries it out.
"""

from __future__ import annotations

from enum import Enum

from wakeful.ingress.errors import ClosedUnanswered, ConnectFailed, UpstreamError

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})


class Body(Enum):
    """What a request's body allows."""

    NONE = "none"
    """No body."""
    KEPT = "kept"
    """A body that can be sent again: read whole before the request went out, or no more of
    it read than what was kept."""
    SPENT = "spent"
    """Part of the body was read past what was kept, and went to a sandbox: it is gone."""


RESEND_PAUSE = 0.05
"""Seconds before a resend after a new connection closed unanswered (`Next.AGAIN_LATER`)."""


class Next(Enum):
    AGAIN = "again"
    """Send it once more to the same sandbox, on a fresh connection."""
    AGAIN_LATER = "again later"
    """Send it once more to the same sandbox after `RESEND_PAUSE`, on a connection idle in
    the pool by then, else a new one."""
    ELSEWHERE = "elsewhere"
    """Send it to another sandbox (never one that refused it already)."""
    GIVE_UP = "give up"
    """The failure is the answer."""


def next_attempt(
    failure: UpstreamError, *, method: str, body: Body, elsewhere: int, again: int, bound: int
) -> Next:
    """The next step after `failure`, for a request with `method` and `body` that was sent
    elsewhere `elsewhere` times and again (to its current sandbox) `again` times so far."""
    if isinstance(failure, ConnectFailed):
        if elsewhere < bound and body is not Body.SPENT:
            return Next.ELSEWHERE
        return Next.GIVE_UP
    if isinstance(failure, ClosedUnanswered):
        if again == 0 and body is Body.NONE and method in IDEMPOTENT:
            return Next.AGAIN_LATER if failure.on_new else Next.AGAIN
        return Next.GIVE_UP
    return Next.GIVE_UP
