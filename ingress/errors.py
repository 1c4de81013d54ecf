"""What can go wrong on the proxy path; the edge alone turns these into status codes.

IngressError
├── NoRoute            the Host header names no app (404)
├── BadRequest         a request we refuse to forward (400)
│   ├── HeadersTooLarge  request line and headers past the bound (431)
│   └── ClientTooSlow    the client went silent mid-body past `client_timeout` (408)
├── ClientGone         the client hung up before its request body was read (no answer)
├── ActivatorUnreachable  the lease API failed in a way it does not name (503)
├── UpstreamBusy       the app's share of upstream connections stayed full (503 + Retry-After)
└── UpstreamError      the sandbox did not answer properly
    ├── ConnectFailed    nothing reached the sandbox (refused, unreachable): safe to retry
    ├── UpstreamFailed   the exchange broke after bytes were sent (502)
    │   └── ClosedUnanswered  the connection ended before any byte of the answer: sent once
    │                         more when it can be replayed (`ingress.retry`), else 502
    └── UpstreamTimeout  the sandbox stayed silent past the timeout (504)

Activator errors (`wakeful.domain.leases`) pass through unchanged: Unavailable is 503 +
Retry-After, UnknownApp is 404.
"""

from __future__ import annotations


class IngressError(Exception):
    """Base of every error the ingress raises on the proxy path."""


class NoRoute(IngressError):
    def __init__(self, host: str) -> None:
        super().__init__(f"no app is served at host {host!r}")
        self.host = host


class BadRequest(IngressError):
    pass


class HeadersTooLarge(BadRequest):
    pass


class ClientTooSlow(BadRequest):
    pass


class ClientGone(IngressError):
    pass


class ActivatorUnreachable(IngressError):
    pass


class UpstreamBusy(IngressError):
    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ClientBusy(IngressError):
    """The client has its share of requests under way (`ingress.clients`): 429."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamError(IngressError):
    pass


class ConnectFailed(UpstreamError):
    pass


class UpstreamFailed(UpstreamError):
    pass


class ClosedUnanswered(UpstreamFailed):
    def __init__(self, message: str, on_new: bool = False) -> None:
        super().__init__(message)
        self.on_new = on_new
        """The connection had carried no request before: not the keep-alive race, but a
        sandbox that shut a connection it had just taken (out of threads, say)."""


class UpstreamTimeout(UpstreamError):
    pass
