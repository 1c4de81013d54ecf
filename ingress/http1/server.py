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
from typing import TYPE_CHECKING

from wakeful.ingress.http1.connection import ClientConnection
from wakeful.ingress.http1.request import Request
from wakeful.ingress.http1.responder import Responder

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


class Handler:
    """What answers the server's requests (`edge.ProxyEdge`, `edge.AdminEdge`, or any function
    through `Handling`). A base class rather than a protocol, as `Responder` is: compiled, a
    call through a protocol is a call through the interpreter; the server makes one a
    request."""

    async def handle(self, request: Request, out: Responder) -> None:
        """Answer `request` through `out`; never raises (but may be cancelled)."""
        raise NotImplementedError


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
        `malformed`, `head-too-large`, `slow-head`, `framing` (a body's chunk framing or
        trailers past the head's bound)."""
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

        self.handshakes = 0
        """TLS connections accepted whose handshake is not done (`_accept_tls`)."""
        self._accepting: asyncio.Task[None] | None = None
        self._listener: socket.socket | None = None

    def full(self) -> bool:
        """As many connections are open as `max_connections` allows, handshakes included."""
        open_ = len(self.connections) + len(self.h2) + self.handshakes
        return open_ >= self.limits.max_connections

    async def start(self, sock: socket.socket, backlog: int) -> None:
        loop = asyncio.get_running_loop()
        if self.tls is None:
            self._server = await loop.create_server(
                lambda: ClientConnection(self, loop), sock=sock, backlog=backlog
            )
            return
        sock.setblocking(False)
        self._listener = sock
        self._accepting = loop.create_task(self._accept_tls(sock))

    async def _accept_tls(self, sock: socket.socket) -> None:
        """The TLS listener's accepts, each connection counted against `max_connections` from
        then on. With `create_server(ssl=...)` the loop counted nothing until a handshake was
        done, and a handshake under way holds a descriptor and the TLS state (about 50 KB):
        20,000 clients that never sent a ClientHello ran the process out of descriptors, and
        both listeners with it. Past the bound a new connection is closed at once (before any
        TLS, so no 503: nginx's `worker_connections` does the same)."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(sock)
                except OSError as exc:  # out of descriptors or memory: accept again later
                    log.warning("the TLS listener cannot accept (%s); again in 0.1 s", exc)
                    await asyncio.sleep(0.1)
                    continue
                if self.full():
                    self.refused("connections")
                    conn.close()
                    continue
                self.handshakes += 1
                task = loop.create_task(self._handshake(conn))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in list(tasks):
                task.cancel()

    async def _handshake(self, conn: socket.socket) -> None:
        """`conn`'s handshake, within the head's deadline, then a `ClientConnection` on it."""
        loop = asyncio.get_running_loop()
        try:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loops do
            except OSError:  # the client is gone already
                conn.close()
                return
            # From here the loop's transport owns `conn`, and closes it when this fails: a
            # handshake that failed (ssl.SSLError is an OSError), a timeout, a client gone.
            try:
                await loop.connect_accepted_socket(
                    lambda: ClientConnection(self, loop),
                    conn,
                    ssl=self.tls,
                    ssl_handshake_timeout=self.limits.head_timeout,
                )
            except (OSError, TimeoutError):
                self.refused("tls-handshake")
        finally:
            self.handshakes -= 1

    async def stop(self, grace: float) -> None:
        """Stop accepting, let the answers under way finish for `grace` seconds, then cancel
        the rest and wait for them (their leases go back on the way out). An answer complete
        but not yet read by its client is still sent until the grace ends."""
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        if self._server is not None:
            self._server.close()
        if self._accepting is not None:
            self._accepting.cancel()  # and the handshakes under way
            await asyncio.wait([self._accepting])
        if self._listener is not None:
            self._listener.close()
        for h2 in list(self.h2):
            h2.shutdown()  # GOAWAY: streams under way finish, no new one starts
        for conn in list(self.connections):
            conn.shutdown()
            if conn.spliced is not None:
                conn.cancel()  # a WebSocket never ends by itself: closed now, clients reconnect
        answering = [conn._runner for conn in self.connections if conn._runner is not None]
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
