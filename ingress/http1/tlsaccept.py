"""The TLS listener's accepts: each connection counted against `max_connections` from its
accept, its handshake done by the loop's TLS (`connect_accepted_socket`) within the head's
deadline, then a `ClientConnection` on it. A handshake that read a request line (plain HTTP
sent to the TLS port) is answered 400 with the reason, as nginx does, through a duplicate of
the connection kept for it (the transport closes its own): it closed without a word before.

With `create_server(ssl=...)` the loop counted nothing until a handshake was done, and a
handshake under way holds a descriptor and the TLS state (about 50 KB): 20,000 clients that
never sent a ClientHello ran the process out of descriptors, and both listeners with it. Past
the bound a new connection is closed at once, before any TLS (so no 503, which a client whose
ALPN would choose h2 reads as a broken preface: nginx's `worker_connections` closes too).

Not a protocol that calls `start_tls` from `connection_made`: uvloop starts reading after
`connection_made` returns, so the ClientHello could reach that protocol, not the TLS one, and
the handshake stalled. Not compiled: the handshake costs far more than this.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import ssl
import time
from typing import TYPE_CHECKING, Final

from wakeful.ingress.http1.connection import ClientConnection

if TYPE_CHECKING:
    from wakeful.ingress.http1.server import HttpServer

log = logging.getLogger(__name__)

BATCH: Final = 64
"""Accepts in a row before the loop runs something else: while connections queue, asyncio's
`sock_accept` returns at once (its own servers stop after `backlog`)."""
SHORT_OF: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
SPARES: Final = 256
"""Handshakes under way that keep a duplicate of their connection, for the 400 a plain HTTP
request gets: a descriptor each, so clients that never finish a handshake hold at most this
many more than `max_connections`; past it, a plain HTTP request is closed without a word."""
DROP_AT_ONCE: Final = 4096
"""Queued connections closed in one go when out of descriptors (past the largest backlog)."""


class TlsAccept:
    """`server`'s TLS listener on `sock` (listening already), from `start` to `close`."""

    def __init__(self, server: HttpServer, sock: socket.socket) -> None:
        self._server = server
        self._sock = sock
        self.handshakes = 0
        """Connections accepted whose handshake is not done: they count as open."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._unowned: set[socket.socket] = set()
        """Accepted, not yet handed to the loop's TLS: closed here if it never is."""
        self._accepting: asyncio.Task[None] | None = None
        self._warned = 0.0
        self._spare: int | None = None
        """A descriptor held for the moment there is none (`_drop_queued`)."""
        self._spares = 0
        """Duplicates held by handshakes under way, for a plain HTTP answer (`SPARES`)."""

    def start(self) -> None:
        self._sock.setblocking(False)
        self._spare = _spare()
        self._accepting = asyncio.get_running_loop().create_task(self._accept())
        self._accepting.add_done_callback(self._ended)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        server = self._server
        in_a_row = 0
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except ConnectionAbortedError:  # the client left while queued
                continue
            except OSError as exc:
                self._warn(exc)
                if exc.errno in SHORT_OF and self._drop_queued():
                    await asyncio.sleep(0)
                else:  # a network error accept(2) passes on, or no descriptor even so
                    await asyncio.sleep(0.1)
                continue
            if server.full():
                server.refused("connections")
                conn.close()
            else:
                self.handshakes += 1
                self._unowned.add(conn)
                task = loop.create_task(self._handshake(conn))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            in_a_row += 1
            if in_a_row >= BATCH:
                in_a_row = 0
                await asyncio.sleep(0)

    def _warn(self, exc: OSError) -> None:
        if time.monotonic() - self._warned > 1:  # one line a second, not one per accept
            self._warned = time.monotonic()
            log.warning("the TLS listener cannot accept: %s", exc)

    def _drop_queued(self) -> int:
        """Out of descriptors: the connections queued are accepted and closed at once, their
        clients told (a reset) rather than left waiting, with the spare descriptor kept for
        it; returns how many. libuv does the same for the plain listener. Waiting instead let
        a queue of silent TLS clients take every descriptor the moment one freed, and the
        plain listener could accept nothing until the attacker let go."""
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        dropped = 0
        try:
            while dropped < DROP_AT_ONCE:
                try:
                    conn, _ = self._sock.accept()
                except OSError:  # none queued (BlockingIOError), or still none to spare
                    break
                conn.close()
                dropped += 1
        finally:
            self._spare = _spare()
        for _ in range(dropped):
            self._server.refused("connections")
        return dropped

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The accepts stopped other than by `close`: say so, and close the listener (its
        backlog would hang every client that connects)."""
        if task.cancelled():
            return
        log.error("the TLS listener stopped accepting", exc_info=task.exception())
        self._sock.close()

    async def _handshake(self, conn: socket.socket) -> None:
        server = self._server
        loop = asyncio.get_running_loop()
        try:
            self._unowned.discard(conn)
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loops do
            except OSError:  # the client is gone already
                conn.close()
                return
            spare: socket.socket | None = None
            if self._spares < SPARES:  # the connection, kept past the transport's close for
                try:  # a plain HTTP answer; past the bound, such a client gets the close alone
                    spare = conn.dup()  # non-blocking: the flag is the connection's, shared
                except OSError:  # no descriptor to spare
                    pass
                else:
                    self._spares += 1
            # From here the loop's transport owns `conn`, and closes it when this fails: a
            # handshake that failed (ssl.SSLError is an OSError), a timeout, a client gone.
            try:
                await loop.connect_accepted_socket(
                    lambda: ClientConnection(server, loop),
                    conn,
                    ssl=server.tls,
                    ssl_handshake_timeout=server.limits.head_timeout,
                )
            except ssl.SSLError as exc:
                if spare is not None and getattr(exc, "reason", None) in PLAIN_HTTP:
                    server.refused("plain-http")
                    await _answer_plain_http(loop, spare)
                else:
                    server.refused("tls-handshake")
            except (OSError, TimeoutError):
                server.refused("tls-handshake")
            finally:
                if spare is not None:
                    spare.close()
                    self._spares -= 1
        finally:
            self.handshakes -= 1

    async def close(self) -> None:
        """No more accepts; the handshakes under way are cancelled (their connections
        closed), and the listener is closed."""
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.wait([self._accepting])
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for conn in self._unowned:  # its task was cancelled before it began
            conn.close()
        self._unowned.clear()
        self.handshakes = 0
        self._sock.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


PLAIN_HTTP: Final = frozenset({"HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "WRONG_VERSION_NUMBER"})
"""OpenSSL's reasons for a handshake whose first bytes are not a TLS record: a request line
it names (GET, POST, HEAD, PUT; CONNECT), or any other (DELETE, OPTIONS, a lowercase method,
HTTP/2's cleartext preface, other bytes), whose method byte it read as a record's type and the
next two as its version. A TLS client's record always has a version it knows. nginx answers
any of them 400 (its 497), from a look at the first byte before the handshake, which here
cost about 100 µs a handshake."""
PLAIN_HTTP_BODY: Final = (
    b"This is an HTTPS port: the request came as plain HTTP. Use an https:// address.\n"
)
PLAIN_HTTP_ANSWER: Final = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(PLAIN_HTTP_BODY), PLAIN_HTTP_BODY)
)
"""What a plain HTTP request on the TLS port is answered (nginx answers it 400 too), where the
handshake would fail and close without a word: the client sees why."""
LINGER_SECONDS: Final = 2.0
LINGER_BYTES: Final = 1 << 20
"""After the answer, what the client still sends is read and dropped, until it closes, for at
most `LINGER_SECONDS` and `LINGER_BYTES` (nginx's lingering close): a close with bytes unread,
or bytes that come after it, resets the connection, and a client still sending (a body, or a
request in pieces) then loses the answer with its write."""


async def _answer_plain_http(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    """`PLAIN_HTTP_ANSWER` (small enough for the socket's buffer: what does not fit is
    dropped), the end of the ingress's side, then the lingering read."""
    try:
        conn.setblocking(False)
        conn.send(PLAIN_HTTP_ANSWER)
        conn.shutdown(socket.SHUT_WR)
    except OSError:  # the client is gone: it gets the close alone
        return
    dropped = 0
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(LINGER_SECONDS):
            while dropped < LINGER_BYTES:
                chunk = await loop.sock_recv(conn, 65536)
                if not chunk:
                    break
                dropped += len(chunk)


def _spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
