"""The HTTP/1.1 server of the proxy and admin ports: listen, hand each connection to a
`ClientConnection`, and stop in order.

`stop` closes the listener, closes idle connections and WebSocket splices, lets exchanges in
progress finish for `grace` seconds, then cancels what is left and waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from wakeful.ingress.http1.connection import ClientConnection
from wakeful.ingress.http1.request import Request
from wakeful.ingress.http1.responder import Responder
from wakeful.ingress.http1.tlsaccept import TlsAccept

if TYPE_CHECKING:
    from wakeful.ingress.http2.connection import H2Connection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a client can hold (invariant 18), all per connection, none kept for ever:

    - the head's size (431 past `max_head_bytes`, counted while it is read);
    - the head's time: complete within `head_timeout` of opening or of the previous answer,
      or the connection closes (408 when a head had begun); an idle keep-alive connection
      closes after `keepalive` seconds;
    - open connections: past `max_connections` a new one gets 503 + Retry-After and closes;
    - the request body: at most `BODY_BUFFER` bytes wait for the proxy, then reading pauses;
    - writes: `Responder.drain` waits for the client's socket at most `client_timeout`
      seconds.
    """

    max_head_bytes: int = 32 * 1024
    head_timeout: float = 10.0
    keepalive: float = 5.0
    max_connections: int = 10_000
    client_timeout: float = 60.0


class Answering(Protocol):
    """A request a handler answers without a task (`Handler.direct`): it tells the connection
    when it ends (`ClientConnection.directed`)."""

    def cancel(self) -> asyncio.Task[None] | None:
        """The client left, or the server stops: end it now, or cancel the task it still
        runs, which ends it, and return that task."""
        ...

    def finished(self) -> asyncio.Future[None]:
        """Done once it ended."""
        ...


class Handler:
    """What answers the server's requests (`edge.ProxyEdge`, `admin.AdminEdge`, or any function
    through `Handling`). A base class rather than a protocol, as `Responder` is: compiled, a
    call through a protocol is a call through the interpreter; the server makes one a
    request."""

    async def handle(self, request: Request, out: Responder) -> None:
        """Answer `request` through `out`; never raises (but may be cancelled)."""
        raise NotImplementedError

    def direct(self, conn: ClientConnection, request: Request) -> Answering | None:
        """Start answering `request`, which has no body and nothing queued before it on
        `conn`, without a task (`ingress.direct`); None, having done nothing, to have `handle`
        answer it on the connection's task. This one always says None."""
        return None


class Handling(Handler):
    """A `Handler` that is a coroutine function: what a program embedding the server (or a
    test) answers with, since a class of its own cannot derive from a compiled one."""

    def __init__(self, handle: Callable[[Request, Responder], Awaitable[None]]) -> None:
        self._handle = handle

    async def handle(self, request: Request, out: Responder) -> None:
        await self._handle(request, out)


class HttpServer:
    def __init__(
        self,
        handler: Handler,
        limits: Limits,
        tls: ssl.SSLContext | None = None,
        http2: bool = False,
        cut_off: Callable[[str], None] = lambda reason: None,
        refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        """`tls`: serve HTTPS with this context; its handshake has the head's deadline.
        `http2`: serve HTTP/2 too (`ingress.http2`): to TLS clients whose ALPN chose `h2`, and
        on a plain listener to clients that open with the HTTP/2 preface (h2c). `cut_off`:
        told why each HTTP/2 connection ended for what its client did (the metrics);
        `refused`, why each other connection was refused or closed for it: `connections`
        (past `max_connections`), `tls-handshake` (failed, or past its deadline),
        `plain-http` (plain HTTP on the TLS port, answered 400), `malformed`,
        `head-too-large`, `slow-head`, `framing` (a body's chunk framing or trailers past
        the head's bound)."""
        self.handler = handler
        self.limits = limits
        self.tls = tls
        self.http2 = http2
        self.cut_off = cut_off
        self.refused = refused
        self.scheme = "http" if tls is None else "https"
        self.connections: set[ClientConnection] = set()
        self.h2: set[H2Connection] = set()
        """Connections handed over to HTTP/2."""
        self._server: asyncio.AbstractServer | None = None

        self._tls: TlsAccept | None = None
        """The TLS listener's accepts and handshakes (`http1.tlsaccept`)."""

    def full(self) -> bool:
        """As many connections are open as `max_connections` allows, handshakes included."""
        open_ = len(self.connections) + len(self.h2)
        if self._tls is not None:
            open_ += self._tls.handshakes
        return open_ >= self.limits.max_connections

    async def start(self, sock: socket.socket, backlog: int) -> None:
        loop = asyncio.get_running_loop()
        if self.tls is None:
            self._server = await loop.create_server(
                lambda: ClientConnection(self, loop), sock=sock, backlog=backlog
            )
            return
        sock.listen(backlog)
        self._tls = TlsAccept(self, sock)
        self._tls.start()

    async def stop(self, grace: float) -> None:
        """Stop accepting, let the answers under way finish for `grace` seconds, then cancel
        the rest and wait for them (their leases go back on the way out). An answer complete
        but not yet read by its client is still sent until the grace ends."""
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        if self._server is not None:
            self._server.close()
        if self._tls is not None:
            await self._tls.close()  # and the handshakes under way
        for h2 in list(self.h2):
            h2.shutdown()  # GOAWAY: streams under way finish, no new one starts
        for conn in list(self.connections):
            conn.shutdown()
            if conn.spliced is not None:
                conn.cancel()  # a WebSocket never ends by itself: closed now, clients reconnect
        answering = [task for conn in self.connections if (task := conn.answering())]
        answering += [task for h2 in self.h2 for task in h2.tasks()]
        if answering:
            await asyncio.wait(answering, timeout=grace)
        running = [task for conn in list(self.connections) if (task := conn.cancel())]
        for h2 in list(self.h2):
            for task in h2.tasks():
                task.cancel()
                running.append(task)
        if running:
            await asyncio.wait(running, timeout=10)
        while (self.connections or self.h2) and loop.time() < until:  # noqa: ASYNC110 (once, at shutdown)
            await asyncio.sleep(0.05)  # closing connections: their last bytes go out
        idle = [task for conn in list(self.connections) if (task := conn._task)]
        for conn in list(self.connections):
            conn._close(abort=True)
        for h2 in list(self.h2):
            h2.abort()
        for task in idle:
            task.cancel()
        if idle:
            await asyncio.wait(idle, timeout=10)
