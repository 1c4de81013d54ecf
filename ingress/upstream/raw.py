"""The upstream transport: `RawTransport` sends requests to sandboxes without a client library.

It implements `ingress.transport.Transport` on asyncio protocols and httptools: a request's
head is one `bytes` (`request_head`), its exchange runs on a pooled `UpstreamConnection`
(`upstream.connection`) within its app's slots (`upstream.pool`), and a WebSocket handshake
goes on a connection of its own (`upstream.handshake`). `send` makes one attempt and raises
only the errors of `ingress.errors`; whether a failed request is sent again, and where, is the
proxy's to decide (`ingress.retry`), so `UpstreamRequest.fresh` asks for a new connection
rather than an idle one (after one closed unanswered, the idle ones may be as stale).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeVar

from wakeful.ingress.errors import ConnectFailed, UpstreamFailed, UpstreamTimeout
from wakeful.ingress.transport import Transport, UpstreamRequest, UpstreamResponse
from wakeful.ingress.upstream.bases import Listener
from wakeful.ingress.upstream.connection import UpstreamConnection
from wakeful.ingress.upstream.h2c import H2Pool, H2Upstream, request_headers
from wakeful.ingress.upstream.h2exchange import H2Exchange
from wakeful.ingress.upstream.handshake import Handshake
from wakeful.ingress.upstream.pool import Dialer, Pool, Slots, TunnelPool

_C = TypeVar("_C", bound=asyncio.Protocol)

_FRAMING: Final = frozenset({b"host", b"content-length"})
"""The request headers `request_head` looks for: what it adds when they are missing."""
_METHODS: Final = {
    m: m.encode() for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
}
"""The common methods' bytes, made once (another is encoded per request)."""


class _RawResponse(UpstreamResponse):
    __slots__ = ("_app", "_conn", "_done", "_transport")

    def __init__(self, transport: RawTransport, app: str, conn: UpstreamConnection) -> None:
        self._transport = transport
        self._app = app
        self._conn = conn
        self._done = False
        self.status = conn.status
        self.headers = conn.headers
        self.trailers = ()
        self.splice = None

    def next_nowait(self) -> bytes | None:
        return self._conn.next_nowait()

    async def next(self) -> bytes:
        return await self._conn.next_chunk()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._transport._finished(self._app, self._conn)


class _Switched(UpstreamResponse):
    """A WebSocket handshake's answer as the proxy reads it: the `Handshake` (an asyncio
    protocol, so not an `UpstreamResponse` itself) is its splice when the sandbox switched."""

    __slots__ = ("_handshake",)

    def __init__(self, handshake: Handshake) -> None:
        self._handshake = handshake
        self.status = handshake.status
        self.headers = handshake.headers
        self.trailers = ()
        self.splice = handshake.splice

    def next_nowait(self) -> bytes | None:
        return self._handshake.next_nowait()

    async def next(self) -> bytes:
        return await self._handshake.next()

    def close(self) -> None:
        self._handshake.close()


class Idle:
    """What `RawTransport.take_idle` took: a connection, the sandbox's authority (the Host a
    request without one gets), and the path its URL carries (before every target)."""

    __slots__ = ("authority", "conn", "prefix")

    def __init__(self, conn: UpstreamConnection, authority: bytes, prefix: bytes) -> None:
        self.conn = conn
        self.authority = authority
        self.prefix = prefix


class RawTransport(Transport):
    def __init__(
        self,
        *,
        connect_timeout: float,
        keepalive: float,
        per_app: int,
        total: int,
        wait: float,
        dialer: Dialer | None = None,
    ) -> None:
        """`dialer`: how `tunnel://` sandboxes are reached (none: they are refused)."""
        self._connect_timeout = connect_timeout
        self._dialer = dialer
        self.keepalive = keepalive
        self.slots = Slots(per_app, total, wait)
        self._pools: dict[str, tuple[Pool, bytes, bytes]] = {}
        self._h2: dict[str, H2Pool] = {}
        """The h2c connections per sandbox URL (`upstream.h2c`)."""
        self._closed = False

    async def __aenter__(self) -> RawTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closed = True
        for pool, _, _ in self._pools.values():
            for conn in list(pool.idle):
                conn.close()
        self._pools.clear()
        for h2 in self._h2.values():
            h2.close()
        self._h2.clear()

    def _pool(self, sandbox: str) -> tuple[Pool, bytes, bytes]:
        """The pool of the sandbox a base URL names, its authority, and the path the URL
        carries (prefixed to every request target; usually none)."""
        found = self._pools.get(sandbox)
        if found is not None:
            return found
        if len(self._pools) > 65_536:  # sandboxes come and go: forget idle ones
            for key, (each, _, _) in list(self._pools.items()):
                if not each.idle:
                    del self._pools[key]
        if sandbox.startswith("tunnel://"):
            node, _, sandbox_id = sandbox.removeprefix("tunnel://").partition("/")
            found = (TunnelPool(node, sandbox_id), sandbox_id.encode("latin-1"), b"")
            self._pools[sandbox] = found
        else:
            rest = sandbox.removeprefix("http://")
            cut = rest.find("/")
            authority, prefix = (rest, "") if cut < 0 else (rest[:cut], rest[cut:].rstrip("/"))
            host, _, port = authority.rpartition(":")
            pool = Pool(host.strip("[]"), int(port))
            found = (pool, authority.encode("latin-1"), prefix.encode("latin-1"))
            self._pools[sandbox] = found
        return found

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        if self._closed:
            raise UpstreamFailed("the upstream transport is closed")
        pool, authority, prefix = self._pool(request.sandbox)
        if request.h2c and not request.upgrade:
            return await self._stream(request, pool, authority, prefix + request.target)
        head, chunked = request_head(
            request.method,
            prefix + request.target,
            authority,
            request.headers,
            request.body is not None,
            request.upgrade,
        )
        if request.upgrade:
            return _Switched(await self._handshake(request, pool, head))
        if not self.slots.try_take(request.app):
            await self.slots.take(request.app)
        try:
            conn = None if request.fresh else pool.take()
            if conn is None:
                conn = await self._connect(pool, lambda: UpstreamConnection(pool))
            try:
                await conn.exchange(head, request.body, chunked, request.method, request.timeout)
            except BaseException:
                conn.close()
                raise
            return _RawResponse(self, request.app, conn)
        except BaseException:
            self.slots.give_back(request.app)
            raise

    def take_idle(self, app: str, sandbox: str) -> Idle | None:
        """An idle pooled connection to `sandbox` and one of `app`'s slots, both taken now, for
        an exchange the direct path (`ingress.direct`) runs; None when either would mean a
        wait or a dial, or the sandbox is behind a tunnel: the general path (`send`) then."""
        if self._closed:
            return None
        pool, authority, prefix = self._pool(sandbox)
        if isinstance(pool, TunnelPool) or not pool.idle or not self.slots.try_take(app):
            return None
        conn = pool.take()
        if conn is None:
            self.slots.give_back(app)
            return None
        return Idle(conn, authority, prefix)

    def begin(
        self,
        idle: Idle,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        timeout: float,
        listener: Listener,
    ) -> None:
        head, _ = request_head(method, idle.prefix + target, idle.authority, headers, False)
        idle.conn.begin(head, method, timeout, listener)

    def finished(self, app: str, idle: Idle) -> None:
        self._finished(app, idle.conn)

    def _finished(self, app: str, conn: UpstreamConnection) -> None:
        """An exchange is over (`_RawResponse.close`, `finished`): the connection back to
        its pool when it ended cleanly, else closed; the slot back."""
        conn.done(self.keepalive)
        self.slots.give_back(app)

    async def _stream(
        self, request: UpstreamRequest, pool: Pool, authority: bytes, target: bytes
    ) -> H2Exchange:
        """An exchange on a stream of a shared h2c connection, within the app's slots (which
        count streams here): a connection with room, else a new one (one dialed at a time per
        sandbox; exchanges that need it meanwhile wait for it)."""
        streams = self._h2.get(request.sandbox)
        if streams is None:
            if len(self._h2) > 65_536:  # sandboxes come and go: forget those with none open
                for key, each in list(self._h2.items()):
                    if not each.conns:
                        del self._h2[key]
            streams = self._h2[request.sandbox] = H2Pool(self.keepalive)
        app = request.app
        if not self.slots.try_take(app):
            await self.slots.take(app)
        try:
            conn = None if request.fresh else streams.take()
            while conn is None:
                if streams.dialing is not None and not request.fresh:
                    try:  # another request opens one: its fate is ours (not k dials in a row)
                        await asyncio.shield(streams.dialing)
                    except ConnectFailed as exc:
                        raise ConnectFailed(str(exc)) from None
                    conn = streams.take()
                    continue
                conn = await self._dial_h2(streams, pool)
            headers = request_headers(request.method, authority, target, request.headers)
            idle = request.timeout if request.idle is None else request.idle
            exchange = conn.open(headers, request.body, idle)
            exchange.on_close = lambda: self.slots.give_back(app)
        except BaseException:
            self.slots.give_back(app)
            raise
        try:
            if request.longest is not None:
                exchange.limit(request.longest)
            # A call's head may come with its first message, whenever that is (a watch).
            await exchange.wait_head(request.timeout if request.idle is None else request.idle)
        except BaseException:
            exchange.close()
            raise
        return exchange

    async def _dial_h2(self, streams: H2Pool, pool: Pool) -> H2Upstream:
        dialing = streams.dialing = asyncio.get_running_loop().create_future()
        try:
            conn = await self._connect(pool, lambda: H2Upstream(streams))
            streams.conns.append(conn)
        except ConnectFailed as exc:
            dialing.set_exception(exc)
            dialing.exception()  # retrieved: no request may be waiting on it
            raise
        finally:
            if streams.dialing is dialing:
                streams.dialing = None
            if not dialing.done():  # dialed, or cancelled: the waiters look (or try) again
                dialing.set_result(None)
        return conn

    async def _handshake(self, request: UpstreamRequest, pool: Pool, head: bytes) -> Handshake:
        """A WebSocket handshake on a connection of its own, holding an exchange slot only
        until the sandbox's answer is in (`ingress.websocket`)."""
        await self.slots.take(request.app)
        try:
            conn = await self._connect(pool, Handshake)
            try:
                async with asyncio.timeout(request.timeout):
                    await conn.send(head)
            except TimeoutError:
                conn.close()
                raise UpstreamTimeout(
                    f"the sandbox did not answer the handshake within {request.timeout:g} s"
                ) from None
            except BaseException:
                conn.close()
                raise
            return conn
        finally:
            self.slots.give_back(request.app)

    async def _connect(self, pool: Pool, kind: Callable[[], _C]) -> _C:
        if isinstance(pool, TunnelPool):
            return await self._dial(pool, kind)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(kind, pool.host, pool.port)
        except TimeoutError:
            raise ConnectFailed(
                f"could not connect to {pool.host}:{pool.port} within {self._connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"could not connect to {pool.host}:{pool.port}: {exc}") from None
        return conn

    async def _dial(self, pool: TunnelPool, kind: Callable[[], _C]) -> _C:
        """A connection through the node's tunnel; the dialer bounds its own wait for a
        free stream (`tunnel_wait`), which a burst may need while the node grows them."""
        if self._dialer is None:
            raise ConnectFailed(
                f"sandbox {pool.sandbox!r} is behind a tunnel and this ingress serves none"
            )
        conn = kind()
        await self._dialer(pool.node, pool.sandbox, conn)
        return conn


def request_head(
    method: str,
    target: bytes,
    authority: bytes,
    headers: list[tuple[bytes, bytes]],
    bodied: bool,
    upgrade: bool = False,
) -> tuple[bytes, bool]:
    """The request line and headers as one `bytes`; whether the body (when `bodied`) goes
    chunked. Each line made by concatenation and the lines joined once on CRLF: compiled,
    that costs less than appending a header's four pieces to one list (a fifth less) or
    formatting its line."""
    lines = [(_METHODS.get(method) or method.encode()) + b" " + target + b" HTTP/1.1"]
    has_host = has_length = False
    for name, value in headers:
        if name in _FRAMING:  # one test per header for the two that are looked for
            if name == b"host":
                has_host = True
            elif not bodied and value != b"0":
                continue  # no body follows: a length would frame the next request as one
            else:
                has_length = True
        lines.append(name + b": " + value)
    if not has_host:
        lines.append(b"host: " + authority)
    chunked = bodied and not has_length
    if chunked:
        lines.append(b"transfer-encoding: chunked")
    if upgrade:  # this hop's own: dropped from what the client sent, put back
        lines.append(b"connection: upgrade\r\nupgrade: websocket")
    lines.append(b"\r\n")  # the join puts the last line's CRLF before it: the blank line
    return b"\r\n".join(lines), chunked
