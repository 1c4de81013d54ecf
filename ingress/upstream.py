"""The upstream transport on asyncio protocols: requests to sandboxes without a client library.

`RawTransport` implements `Transport` with one `asyncio.Protocol` per upstream connection and
httptools (the C parser uvicorn uses) for response heads and framing. Nothing per request is
built that the exchange does not need: the request head is one `bytes`, the body chunks pass
through, and the response body is handed up as it arrives.

Connections are pooled per sandbox address; an idle one is closed after `keepalive` seconds
(below the sandbox's own idle timeout). What bounds them:

- **Per app.** At most `per_app` exchanges of one app hold a connection at once, and at most
  `total` over every app. A request past either waits up to `wait` seconds for a slot, first
  come first served, then gets `UpstreamBusy` (503 + Retry-After). One app with a thousand
  open streams cannot take the connections every other app needs.
- **Backpressure both ways.** Reading from the sandbox pauses while more than `HIGH_WATER`
  bytes of its answer wait for the client; writing the request body waits while the
  sandbox's socket buffer is full.
- **Silence.** `request.timeout` seconds before the answer's head, and between body reads.

**One attempt per send.** A connection that closes or resets before a single byte of the
answer arrived raises `ClosedUnanswered` (the keep-alive race: the sandbox closed an idle
connection as the request went out; or a sandbox that died mid-request); one that could not
be opened, `ConnectFailed`; anything else that broke after the request was written,
`UpstreamFailed`. Whether the request is sent again, and where, is the proxy's to decide
(`ingress.retry`, invariant 11): `UpstreamRequest.fresh` then asks for a new connection rather
than an idle one, which may be as stale.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import httptools

from wakeful.ingress.errors import (
    ClosedUnanswered,
    ConnectFailed,
    UpstreamBusy,
    UpstreamFailed,
    UpstreamTimeout,
)
from wakeful.ingress.flow import WriteGate
from wakeful.ingress.timers import Deadline
from wakeful.ingress.transport import UpstreamRequest, UpstreamResponse
from wakeful.ingress.tunnel import MAX_REFUSAL_BYTES, Pipe

HIGH_WATER = 256 * 1024
"""Answer bytes buffered for a slow client before reading from the sandbox pauses."""
MAX_FRAMING_BYTES = 64 * 1024
"""Bytes of an answer that are not body (status line, headers, chunk sizes, trailers) in a row:
past it the answer is refused. httptools buffers a header line whole, so without this a
sandbox sending one endless header could fill the ingress's memory."""
MAX_IDLE_PER_SANDBOX = 256
_C = TypeVar("_C", bound=asyncio.Protocol)


class _Extra(Exception):
    """A second answer began on the connection before a request asked for it."""


class _Gated(asyncio.Protocol):
    """A sandbox connection whose writes wait at `_writable` while the transport is full."""

    _writable: WriteGate

    def pause_writing(self) -> None:
        self._writable.close()

    def resume_writing(self) -> None:
        self._writable.open()


class _Connection(_Gated):
    """One upstream connection; carries one exchange at a time."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._deadline = Deadline(self._loop, self._timed_out)
        """While pooled: when the idle connection closes. During an exchange: when the
        sandbox's silence ends it (pushed on by every read)."""
        self._silence = 0.0
        self._idle = True
        self._head_seen = False
        # the exchange in progress
        self._parser: httptools.HttpResponseParser | None = None
        self._head_only = False
        self._interim = False
        self._got_bytes = False
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._keep_alive = False
        self._extra = False
        self._chunked_body = False
        self._framing = 0
        self._body_bytes = 0
        self._error: BaseException | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._writable = WriteGate(self._loop)
        self._writer: asyncio.Task[None] | None = None
        self._body_sent = True

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _tuned(transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or self._complete:  # bytes nobody asked for: unusable
            self._abort(UpstreamFailed("the sandbox sent bytes outside an answer"))
            return
        self._got_bytes = True
        if self._head_seen and not self._complete:  # silence: from the last read, now
            self._deadline.after(self._silence)
        body_before = self._body_bytes
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._abort(UpstreamFailed("the sandbox switched protocols unasked"))
            return
        except httptools.HttpParserError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, _Extra) or self._extra:
                self._abort(UpstreamFailed("the sandbox sent more than one answer"))
            elif isinstance(cause, UpstreamFailed):
                self._abort(cause)
            else:
                self._abort(UpstreamFailed(f"the sandbox's answer is not valid HTTP: {exc}"))
            return
        if self._complete:
            return
        # Framing read in a row (no body byte came with it): bounded, see MAX_FRAMING_BYTES.
        self._framing = 0 if self._body_bytes != body_before else self._framing + len(data)
        if self._framing > MAX_FRAMING_BYTES:
            self._abort(UpstreamFailed("the sandbox's answer head or trailers are too large"))

    def eof_received(self) -> bool:
        self._ended(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._deadline.cancel()
        self._pool.forget(self)
        self._ended(exc)
        self._writable.fail(UpstreamFailed("the sandbox closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:  # a second answer in the same read: the stream is not ours
            self._extra = True
            raise _Extra

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue and friends: not the answer
            self._interim = True
            self._headers = []
            return
        if not 200 <= status <= 599:
            raise UpstreamFailed(f"the sandbox answered with status {status}")
        self._status = status
        self._head_seen = True
        self._deadline.after(self._silence)  # the head ended a silence: the body's starts
        if self._head is not None and not self._head.done():
            self._head.set_result(None)
        if self._head_only:  # no body follows a HEAD answer, whatever it says
            self._keep_alive = self._parser.should_keep_alive()
            self._finish()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
            self._deadline.clear()  # not the sandbox's silence while we do not read
        if self._wakeup is not None:
            self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        assert self._parser is not None
        # Asked now: llhttp resets what it knows once the callback returns.
        self._keep_alive = self._parser.should_keep_alive()
        self._finish()

    # -- the exchange ------------------------------------------------------------------

    def _finish(self) -> None:
        if not self._complete:
            self._complete = True
            self._deadline.clear()
            if self._wakeup is not None:
                self._wake()

    def _ended(self, exc: BaseException | None) -> None:
        """The sandbox closed its side, or the connection broke."""
        if self._parser is None or self._complete:
            return
        if isinstance(exc, ConnectFailed) and not self._got_bytes:
            self._fail(exc)  # a tunnel's node could not reach the sandbox: nothing did
        elif not self._got_bytes:
            self._fail(ClosedUnanswered("the connection closed before any answer"))
        elif self._head is not None and self._head.done() and self._until_close():
            self._finish()  # an answer framed by the end of the connection
        else:
            reason = f": {exc}" if exc else ""
            self._fail(UpstreamFailed(f"the sandbox closed the connection mid-answer{reason}"))

    def _until_close(self) -> bool:
        names = {name.lower() for name, _ in self._headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _fail(self, exc: BaseException) -> None:
        if self._complete:
            return  # the answer is whole: only the connection is lost (see `reusable`)
        if self._error is None:
            self._error = exc
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a caller that left must not log it
        self._wake()

    def _abort(self, exc: BaseException) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def exchange(
        self,
        head: bytes,
        body: AsyncIterable[bytes] | None,
        chunked: bool,
        method: str,
        silence: float,
    ) -> asyncio.Future[None]:
        """Write the request; the future is done once the answer's head is in, or raises
        ClosedUnanswered, ConnectFailed, UpstreamFailed, or UpstreamTimeout when the head took
        longer than `silence` seconds (then each body read may take as long)."""
        assert self.transport is not None
        self._idle = False
        self._silence = silence
        self._head_seen = False
        self._deadline.after(silence)
        self._parser = httptools.HttpResponseParser(self)
        self._head_only = method == "HEAD"
        self._interim = self._got_bytes = self._complete = self._paused = False
        self._keep_alive = self._extra = False
        self._chunked_body = chunked
        self._framing = self._body_bytes = 0
        self._status, self._headers, self._error = 0, [], None
        self._chunks.clear()
        self._buffered = 0
        self._head = self._loop.create_future()
        self.transport.write(head)
        self._body_sent = body is None
        if body is not None:
            self._writer = self._loop.create_task(self._send_body(body, chunked))
        return self._head

    async def _send_body(self, body: AsyncIterable[bytes], chunked: bool) -> None:
        transport = self.transport
        assert transport is not None
        try:
            async with contextlib.aclosing(_iterate(body)) as chunks:
                async for chunk in chunks:
                    if self.closed or self._error is not None:
                        return
                    if chunked:
                        transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                    else:
                        transport.write(chunk)
                    if (closed := self._writable.waiting()) is not None:
                        await closed
            if chunked and not self.closed:
                transport.write(b"0\r\n\r\n")
            self._body_sent = True
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the client left mid-body, or the sandbox did
            if isinstance(exc, UpstreamFailed) and self._got_bytes:
                return  # the sandbox answered early and stopped reading: its answer stands
            self._abort(exc)

    def next_nowait(self) -> bytes | None:
        """The next piece of the answer's body already read; b"" at its end; None when it
        has not come yet."""
        if self._chunks:
            chunk = self._chunks.popleft()
            self._buffered -= len(chunk)
            if self._paused and self._buffered <= HIGH_WATER // 4 and self.transport:
                self._paused = False
                self.transport.resume_reading()
                if not self._complete:
                    self._deadline.after(self._silence)
            return chunk
        if self._complete:
            return b""
        if self._error is not None:
            raise self._error
        return None

    async def next_chunk(self) -> bytes:
        """The next piece of the answer's body; b"" at its end. Raises UpstreamTimeout when
        the sandbox stays silent (see `exchange`)."""
        while True:
            chunk = self.next_nowait()
            if chunk is not None:
                return chunk
            self._wakeup = self._loop.create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None

    def _timed_out(self) -> None:
        if self._idle:
            self.close()
        else:
            self._abort(UpstreamTimeout(f"the sandbox stayed silent for {self._silence:g} s"))

    def reusable(self) -> bool:
        return (
            not self.closed
            and self._complete
            and self._keep_alive
            and self._error is None
            and self._body_sent
            and not self._extra
            # A body sent chunked may have been left unread by an app that reads only
            # Content-Length bodies: its bytes would be taken as the next request.
            and not self._chunked_body
            # A HEAD answer ends with its head, whatever it says: a sandbox that sends a body
            # after it anyway would have those bytes read as the next request's answer.
            and not self._head_only
        )

    def done(self, keepalive: float) -> None:
        """The exchange is over: back to the pool when it ended cleanly, else closed."""
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
        if self.reusable():
            self._parser = None
            self._idle = True
            self._deadline.after(keepalive)
            self._pool.give_back(self)
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
        self._deadline.cancel()
        self._pool.forget(self)


class _Pool:
    """Idle connections to one sandbox address."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: collections.deque[_Connection] = collections.deque()

    def give_back(self, conn: _Connection) -> None:
        if len(self.idle) >= MAX_IDLE_PER_SANDBOX:
            conn.close()
            return
        self.idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def take(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()  # the most recently used: least likely to be closing
            if not conn.closed:
                return conn
        return None


class _TunnelPool(_Pool):
    """A sandbox on a node reached through its tunnel (`tunnel://NODE/SANDBOX`,
    `ingress.nodestreams`): every exchange takes a stream of its own, and a clean end gives
    the stream back to the node's idle streams (the node keeps its socket to the sandbox)."""

    def __init__(self, node: str, sandbox: str) -> None:
        super().__init__(node, 0)
        self.node = node
        self.sandbox = sandbox

    def give_back(self, conn: _Connection) -> None:
        transport = conn.transport
        conn.closed = True
        conn._deadline.cancel()
        release = getattr(transport, "release", None)
        if release is not None:
            release(True)
        elif transport is not None:
            transport.close()

    def take(self) -> _Connection | None:
        return None


Dialer = Callable[[str, str, asyncio.Protocol], Awaitable[asyncio.Transport]]
"""Opens a connection to a tunnelled node's sandbox (node, sandbox id, protocol)."""


@dataclass
class _Slots:
    """How many exchanges hold a connection, per app and in all; who waits for one. Waiters
    queue per app, first come first served within an app: a request of an app below its
    share never waits behind another app's queue."""

    per_app: int
    total: int
    wait: float
    busy: collections.Counter[str] = field(default_factory=collections.Counter)
    in_use: int = 0
    waiters: dict[str, collections.deque[asyncio.Future[None]]] = field(default_factory=dict)

    def _free(self, app: str) -> bool:
        return self.in_use < self.total and self.busy[app] < self.per_app

    def try_take(self, app: str) -> bool:
        """Take a slot now if one is free and nobody of `app` waits for one."""
        if self.in_use < self.total and self.busy[app] < self.per_app and not self.waiters.get(app):
            self.busy[app] += 1
            self.in_use += 1
            return True
        return False

    async def take(self, app: str) -> None:
        """A slot, waiting for one at most `wait` seconds (UpstreamBusy past it)."""
        if self.try_take(app):
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self.waiters.setdefault(app, collections.deque())
        queue.append(waiter)
        try:
            async with asyncio.timeout(self.wait):
                await waiter
        except BaseException as exc:
            granted = waiter.done() and not waiter.cancelled()
            if isinstance(exc, TimeoutError):
                if granted:
                    return  # granted just as the wait ran out: it is ours
                raise UpstreamBusy(
                    f"app {app!r} has {self.busy[app]} requests in flight to its sandboxes "
                    f"(at most {self.per_app}; {self.in_use} of {self.total} in all) and "
                    f"none finished within {self.wait:g} s",
                    retry_after=1,
                ) from None
            if granted:
                self.give_back(app)  # granted as it was cancelled: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
            if not queue and self.waiters.get(app) is queue:
                del self.waiters[app]

    def _hold(self, app: str) -> None:
        self.busy[app] += 1
        self.in_use += 1

    def give_back(self, app: str) -> None:
        busy = self.busy[app] - 1
        if busy:
            self.busy[app] = busy
        else:
            del self.busy[app]
        self.in_use -= 1
        if not self.waiters:
            return
        self._grant(app)  # its own queue first: only it was short of its share
        for other in list(self.waiters):  # then whoever waited for the total
            if self.in_use >= self.total:
                break
            self._grant(other)

    def _grant(self, app: str) -> None:
        queue = self.waiters.get(app)
        while queue and self._free(app):
            waiter = queue.popleft()
            if not waiter.done():
                self._hold(app)
                waiter.set_result(None)


class _RawResponse:
    __slots__ = ("_app", "_conn", "_done", "_transport", "headers", "status")
    tunnel = None

    def __init__(self, transport: RawTransport, app: str, conn: _Connection) -> None:
        self._transport = transport
        self._app = app
        self._conn = conn
        self._done = False
        self.status = conn._status
        self.headers: Sequence[tuple[bytes, bytes]] = conn._headers

    def next_nowait(self) -> bytes | None:
        return self._conn.next_nowait()

    async def next(self) -> bytes:
        return await self._conn.next_chunk()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._conn.done(self._transport.keepalive)
            self._transport.slots.give_back(self._app)


class RawTransport:
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
        self.slots = _Slots(per_app, total, wait)
        self._pools: dict[str, tuple[_Pool, bytes, bytes]] = {}
        self._closed = False

    async def __aenter__(self) -> RawTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closed = True
        for pool, _, _ in self._pools.values():
            for conn in list(pool.idle):
                conn.close()
        self._pools.clear()

    def _pool(self, sandbox: str) -> tuple[_Pool, bytes, bytes]:
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
            found = (_TunnelPool(node, sandbox_id), sandbox_id.encode("latin-1"), b"")
            self._pools[sandbox] = found
        else:
            rest = sandbox.removeprefix("http://")
            cut = rest.find("/")
            authority, prefix = (rest, "") if cut < 0 else (rest[:cut], rest[cut:].rstrip("/"))
            host, _, port = authority.rpartition(":")
            pool = _Pool(host.strip("[]"), int(port))
            found = (pool, authority.encode("latin-1"), prefix.encode("latin-1"))
            self._pools[sandbox] = found
        return found

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        if self._closed:
            raise UpstreamFailed("the upstream transport is closed")
        pool, authority, prefix = self._pool(request.sandbox)
        head, chunked = _request_head(request, prefix + request.target, authority)
        if request.upgrade:
            return await self._handshake(request, pool, head)
        if not self.slots.try_take(request.app):
            await self.slots.take(request.app)
        try:
            conn = None if request.fresh else pool.take()
            if conn is None:
                conn = await self._connect(pool, _Connection)
            try:
                await conn.exchange(head, request.body, chunked, request.method, request.timeout)
            except BaseException:
                conn.close()
                raise
            return _RawResponse(self, request.app, conn)
        except BaseException:
            self.slots.give_back(request.app)
            raise

    async def _handshake(self, request: UpstreamRequest, pool: _Pool, head: bytes) -> Handshake:
        """A WebSocket handshake on a connection of its own, holding an exchange slot only
        until the sandbox's answer is in (`ingress.tunnel`)."""
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

    async def _connect(self, pool: _Pool, kind: Callable[[_Pool], _C]) -> _C:
        if isinstance(pool, _TunnelPool):
            return await self._dial(pool, kind)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(lambda: kind(pool), pool.host, pool.port)
        except TimeoutError:
            raise ConnectFailed(
                f"could not connect to {pool.host}:{pool.port} within {self._connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"could not connect to {pool.host}:{pool.port}: {exc}") from None
        return conn

    async def _dial(self, pool: _TunnelPool, kind: Callable[[_Pool], _C]) -> _C:
        """A connection through the node's tunnel; the dialer bounds its own wait for a
        free stream (`tunnel_wait`), which a burst may need while the node grows them."""
        if self._dialer is None:
            raise ConnectFailed(
                f"sandbox {pool.sandbox!r} is behind a tunnel and this ingress serves none"
            )
        conn = kind(pool)
        await self._dialer(pool.node, pool.sandbox, conn)
        return conn


class Handshake(_Gated):
    """A WebSocket handshake's upstream connection, then (after a 101) the sandbox's end of
    its tunnel (`ingress.tunnel.Side`). Never pooled; closed with the response. Any other
    answer is read whole (bounded) and passed on as it is."""

    def __init__(self, pool: _Pool) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[None] = self._loop.create_future()
        self._interim = False
        self._answered = False
        self._switched = False
        self._framing = 0
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()
        self._writable = WriteGate(self._loop)
        self.pipe = Pipe(self._pause, self._resume)
        self.closed = False

    def _pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _tuned(transport)

    def data_received(self, data: bytes) -> None:
        if self._switched:
            self.pipe.feed(data)
            return
        if self._head.done():  # bytes after a refusal's answer: not ours to pass on
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self.status != 101 or self._head.done():
                self._fail(UpstreamFailed("the sandbox switched protocols without a 101"))
                return
            self._switched = True
            self._head.set_result(None)
            self.pipe.feed(data[exc.args[0] :])
            return
        except httptools.HttpParserError as exc:
            cause = exc.__cause__ or exc.__context__
            reason = cause if isinstance(cause, UpstreamFailed) else None
            self._fail(reason or UpstreamFailed(f"the sandbox's answer is not valid HTTP: {exc}"))
            return
        if not self.status:
            self._framing += len(data)
            if self._framing > MAX_FRAMING_BYTES:
                self._fail(UpstreamFailed("the sandbox's answer head is too large"))

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._ended()
        self._writable.fail(UpstreamFailed("the sandbox closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._answered:  # a second answer in the same read: never ours to pass on
            raise UpstreamFailed("the sandbox sent more than one answer to the handshake")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer: not the answer
            self._interim = True
            self.headers = []
            return
        if not (status == 101 or 200 <= status <= 599):
            raise UpstreamFailed(f"the sandbox answered with status {status}")
        self.status = status

    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > MAX_REFUSAL_BYTES:
            raise UpstreamFailed(
                f"the sandbox refused the WebSocket with a body over {MAX_REFUSAL_BYTES} bytes"
            )

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._answered = True  # a 101's upgrade, or a refusal's end: nothing may follow
        if self.status != 101 and not self._head.done():
            self._head.set_result(None)

    # -- the handshake and the tunnel ----------------------------------------------------

    def _ended(self) -> None:
        self.pipe.end()
        if self._head.done():
            return
        framed = {name.lower() for name, _ in self.headers}
        if (
            self.status
            and self.status != 101
            and not framed & {b"content-length", b"transfer-encoding"}
        ):
            self._head.set_result(None)  # a refusal framed by the end of the connection
        else:
            self._fail(UpstreamFailed("the sandbox closed the connection during the handshake"))

    def _fail(self, exc: BaseException) -> None:
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a caller that left must not log it
        if self.transport is not None:
            self.transport.abort()

    async def send(self, head: bytes) -> None:
        """Write the handshake; return once the answer is in (a 101's head, or a whole
        refusal)."""
        assert self.transport is not None
        self.transport.write(head)
        await self._head

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        if (closed := self._writable.waiting()) is not None:
            await closed
        if self.closed:
            raise UpstreamFailed("the sandbox closed the connection")

    # -- as an UpstreamResponse ----------------------------------------------------------

    @property
    def tunnel(self) -> Handshake | None:
        return self if self._switched else None

    def next_nowait(self) -> bytes:
        """The refusal's body, whole (read before the head was handed up), then b""."""
        body, self._body = bytes(self._body), bytearray()
        return body

    async def next(self) -> bytes:
        return self.next_nowait()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


def _tuned(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """An upstream connection as both kinds use it: no Nagle delay, writes bounded."""
    transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.set_write_buffer_limits(high=HIGH_WATER)
    return transport


async def _iterate(body: AsyncIterable[bytes]) -> AsyncGenerator[bytes, None]:
    """`body`'s non-empty chunks, as a generator `aclosing` can close."""
    async for chunk in body:
        if chunk:
            yield chunk


def _request_head(request: UpstreamRequest, target: bytes, authority: bytes) -> tuple[bytes, bool]:
    """The request line and headers as one `bytes`; whether the body goes chunked."""
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), target)]
    has_host = has_length = False
    for name, value in request.headers:
        if name == b"host":
            has_host = True
        elif name == b"content-length":
            has_length = True
        lines.append(b"%s: %s\r\n" % (name, value))
    if not has_host:
        lines.append(b"host: %s\r\n" % authority)
    chunked = request.body is not None and not has_length
    if chunked:
        lines.append(b"transfer-encoding: chunked\r\n")
    if request.upgrade:  # this hop's own: dropped from what the client sent, put back
        lines.append(b"connection: upgrade\r\nupgrade: websocket\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), chunked
