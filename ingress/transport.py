"""The upstream transport's interface: what the proxy needs to send a request to a sandbox.

`Transport.send` is the interface; `ingress.upstream.RawTransport` implements it, and only
raises the errors of `ingress.errors`. One `send` is one attempt: whether a failure is tried
again, and where, is `ingress.retry`'s. The response body streams: nothing reads a whole body
into memory. `take_idle`, `begin` and `finished` serve the direct path (`ingress.direct`): an
exchange on an idle pooled connection, run in callbacks.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wakeful.ingress.upstream.bases import Listener
    from wakeful.ingress.upstream.raw import Idle
    from wakeful.ingress.websocket import Side


@dataclass(slots=True, init=False)
class UpstreamRequest:
    app: str
    """Whose request it is: upstream connections are bounded per app."""
    method: str
    sandbox: str
    """The sandbox's base URL, from a lease (`http://10.0.0.5:8080`)."""
    target: bytes
    """The request target as the client sent it (a path and query)."""
    headers: list[tuple[bytes, bytes]]
    body: AsyncIterable[bytes] | None
    timeout: float
    """Seconds the sandbox may stay silent: before its answer starts, and between reads."""
    upgrade: bool = False
    """A WebSocket handshake (`ingress.websocket`): sent on a connection of its own with its
    `Connection: upgrade` and `Upgrade: websocket`; a 101 answer comes with a `splice`."""
    fresh: bool = False
    """Send it on a new connection, not an idle one: it is sent again because a connection
    closed before any answer (`ClosedUnanswered`), and the idle ones may be as stale."""
    h2c: bool = False
    """The app speaks cleartext HTTP/2 (`protocol = "h2c"`): a stream on a shared connection
    (`ingress.upstream.h2c`)."""
    idle: float | None = None
    """A call that streams (gRPC): after the head, each read may wait this long (the app's
    stream idle timeout) instead of `timeout`..."""
    longest: float | None = None
    """...and the whole exchange lasts at most this long."""

    def __init__(  # written out: compiled, where a dataclass's own would be interpreted
        self,
        app: str,
        method: str,
        sandbox: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: AsyncIterable[bytes] | None,
        timeout: float,
        upgrade: bool = False,
        fresh: bool = False,
        h2c: bool = False,
        idle: float | None = None,
        longest: float | None = None,
    ) -> None:
        self.app = app
        self.method = method
        self.sandbox = sandbox
        self.target = target
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.upgrade = upgrade
        self.fresh = fresh
        self.h2c = h2c
        self.idle = idle
        self.longest = longest


class UpstreamResponse:
    """A sandbox's answer as the proxy reads it (`upstream.raw`'s, an h2c stream's, a
    handshake's). A base class rather than a protocol: compiled, the proxy's calls on it (its
    head, its body piece by piece, its end) are direct calls, not calls through the
    interpreter."""

    __slots__ = ("headers", "splice", "status", "trailers")

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    trailers: Sequence[tuple[bytes, bytes]]
    """Fields after the body (HTTP/2's trailers: gRPC's status), once it ended."""
    splice: Side | None
    """The sandbox's end of a switched connection (a 101 to an `upgrade` request)."""

    def next_nowait(self) -> bytes | None:
        """The next piece of the body already here; b"" at its end; None when the next has
        not come yet (then `await next()`). Raises UpstreamFailed / UpstreamTimeout."""
        raise NotImplementedError

    async def next(self) -> bytes:
        """The next piece of the body, once it comes; b"" at its end."""
        raise NotImplementedError

    def close(self) -> None:
        """Give the connection back (kept alive if the body was read to the end)."""
        raise NotImplementedError


class Transport:
    """A base class rather than a protocol, as `UpstreamResponse` is: compiled, the proxy's
    `send` (one a request) is a direct call."""

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send the request and return once the response head has arrived.

        Raises ConnectFailed when nothing reached the sandbox (safe to retry elsewhere),
        ClosedUnanswered when the connection ended before any byte of the answer,
        UpstreamFailed when the exchange broke after that, UpstreamTimeout when it went quiet.
        """
        raise NotImplementedError

    def take_idle(self, app: str, sandbox: str) -> Idle | None:
        """An idle pooled connection to `sandbox` and one of `app`'s slots, both taken now;
        None, with nothing taken, when either would mean a wait (or this transport keeps
        none): the request goes by `send`."""
        return None

    def begin(
        self,
        idle: Idle,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        timeout: float,
        listener: Listener,
    ) -> None:
        """Write a request with no body on `idle`'s connection; its answer is told to
        `listener` (`UpstreamConnection.begin`)."""
        raise NotImplementedError

    def finished(self, app: str, idle: Idle) -> None:
        """The exchange on `idle` is over: its connection and slot go back."""
        raise NotImplementedError
