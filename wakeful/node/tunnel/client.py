"""A dial-out node's end of its tunnels to the ingress tier (seed 003).

With `WAKEFUL_TUNNEL` set, the node agent is never dialed: it opens streams (one WebSocket
each, `wakeful.domain.tunnelwire`) through the load balancer in front of the ingress
replicas, and each replica hands requests for this node's sandboxes to the streams that landed
on it. The node cannot choose where a stream lands, so it sizes its streams per replica, from
what each replica's streams carry, every second (`wakeful.domain.coverage`): grow where calls
are in flight and every stream is busy, fill toward the reserve where a replica is short,
evacuate a replica the balancer starves, prune what sat unused. It publishes each replica's
streams, busy, budget and state in its node record (`Node.tunnel`), which is also how the
activator learns whether it is reachable at all and how replicas learn where to relay.

An exchange is a byte pipe from a stream to a socket on one of this node's own sandboxes:
the CONNECT names a sandbox id, and `targets` answers with its local address only for a
sandbox this agent runs and has seen ready. Nothing else on the node's network is reachable
through a tunnel. A socket the ingress says may be reused (its answer was whole) is kept for
the next exchange to the same sandbox for a few seconds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import websockets
from websockets.asyncio.client import ClientConnection, connect

from wakeful.aio.pipe import Pipe
from wakeful.domain import coverage
from wakeful.domain import tunnelwire as wire
from wakeful.domain.backoff import Backoff, Retries
from wakeful.domain.models import ReplicaCoverage, Tunnel

log = logging.getLogger(__name__)

SOCKET_KEEPALIVE = 4.0
"""A sandbox socket kept for the next exchange is closed after this long (below uvicorn's 5 s)."""
MAX_KEPT_PER_SANDBOX = 8
CONNECT_TIMEOUT = 5.0
WRITE_STALL = 60.0
"""Seconds a sandbox may leave a request's bytes unread (the ingress's `client_timeout`)."""
OPEN_BACKOFF = Backoff(0.5, cap=30.0)
"""Between attempts to open a stream while they fail (a refusal for now, a 503, is not one)."""
PUBLISH_EVERY = 5.0
"""Busy counts change with every call: the table is rewritten at most this often unless a
replica's streams or state, or reachability, changed."""

WS_OPTIONS: dict[str, Any] = {**wire.WEBSOCKET_OPTIONS, "open_timeout": 15}

Targets = Callable[[str], tuple[str, int] | None]
Publish = Callable[[Tunnel], Awaitable[None]]


class TunnelURLError(ValueError):
    pass


@dataclass(frozen=True)
class TunnelURL:
    """Where the node's streams go: the ingress tier's tunnel listeners, through their load
    balancer (`WAKEFUL_TUNNEL`, parsed)."""

    url: str
    """The WebSocket URL each stream opens (`wss://HOST[:PORT][/PATH]/v1/tunnel`)."""
    secure: bool


def parse_url(url: str) -> TunnelURL:
    """`https://edge.example[:port][/path]/` (TLS, the usual) or `http://host:port` (plain:
    for a load balancer on the same private network, or tests)."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "wss", "ws"):
        raise TunnelURLError(f"WAKEFUL_TUNNEL: {url!r} must start with https:// or http://")
    if not parts.hostname:
        raise TunnelURLError(f"WAKEFUL_TUNNEL: {url!r} names no host")
    secure = parts.scheme in ("https", "wss")
    try:
        port = parts.port or (443 if secure else 80)
    except ValueError:
        raise TunnelURLError(f"WAKEFUL_TUNNEL: {url!r} has an invalid port") from None
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    scheme = "wss" if secure else "ws"
    path = parts.path.rstrip("/")
    return TunnelURL(f"{scheme}://{shown}:{port}{path}{wire.OPEN}", secure)


class _Socket(asyncio.Protocol):
    """A socket to a sandbox: what it sent, waiting to go up the stream (`received`, bounded);
    writes with flow control."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.received = Pipe(self._pause_reading, self._resume_reading)
        self.closed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self.expiry: asyncio.TimerHandle | None = None

    @property
    def eof(self) -> bool:
        """The sandbox sent all it will (what it sent may still wait in `received`)."""
        return self.received.ended

    @property
    def spoiled(self) -> bool:
        """Not fit for another exchange: closed, or the sandbox ended or sent unasked bytes."""
        return self.closed or self.received.ended or self.received.size > 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received.feed(data)

    def eof_received(self) -> bool:
        self.received.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        self.received.end()

    def _pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def read(self) -> bytes:
        """The next bytes the sandbox sent, at most what one message carries; b"" once it
        closed."""
        return await self.received.get(wire.CHUNK)

    async def write(self, data: bytes) -> None:
        """Write; wait while the sandbox does not read, at most `WRITE_STALL` seconds, then
        give up on it (the socket is aborted): the stream must get back to reading its END."""
        if self.closed or self.transport is None:
            return
        self.transport.write(data)
        if self._writable.is_set():
            return
        try:
            async with asyncio.timeout(WRITE_STALL):
                await self._writable.wait()
        except TimeoutError:
            self.transport.abort()
            self.closed = True

    def close(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
        if self.transport is not None:
            self.transport.close()
        self.closed = True


class _Sockets:
    """Sockets kept between exchanges, per sandbox."""

    def __init__(self) -> None:
        self._kept: dict[str, list[_Socket]] = {}

    def take(self, sandbox: str) -> _Socket | None:
        kept = self._kept.get(sandbox)
        while kept:
            sock = kept.pop()
            if sock.expiry is not None:
                sock.expiry.cancel()
            if not sock.spoiled:
                return sock
            sock.close()
        return None

    def keep(self, sandbox: str, sock: _Socket) -> None:
        kept = self._kept.setdefault(sandbox, [])
        if len(kept) >= MAX_KEPT_PER_SANDBOX or sock.spoiled:
            sock.close()
            return
        kept.append(sock)

        def expire() -> None:
            with contextlib.suppress(ValueError):
                kept.remove(sock)
            sock.close()
            if not kept and self._kept.get(sandbox) is kept:
                del self._kept[sandbox]

        sock.expiry = asyncio.get_running_loop().call_later(SOCKET_KEEPALIVE, expire)

    def close(self) -> None:
        for kept in self._kept.values():
            for sock in kept:
                sock.close()
        self._kept.clear()


class _Stream:
    """One stream: its call, the replica it landed on, and what it carries."""

    def __init__(self, sid: int, opened_at: float) -> None:
        self.id = sid
        self.connection: ClientConnection | None = None
        self.replica = ""
        self.opened_at = opened_at
        self.last_used = opened_at
        self.busy = False
        self.closing = False
        self._lock = asyncio.Lock()

    async def send(self, message: bytes) -> None:
        assert self.connection is not None
        async with self._lock:
            await self.connection.send(message)

    async def recv(self) -> bytes | None:
        """The next message; None once the stream closed."""
        assert self.connection is not None
        try:
            message = await self.connection.recv()
        except websockets.ConnectionClosed:
            return None
        if not isinstance(message, bytes):
            raise wire.WireError("a text message on a tunnel")
        return message


class TunnelClient:
    """Opens, carries and sizes this node's streams until cancelled."""

    def __init__(
        self,
        url: str,
        node: str,
        token: str,
        targets: Targets,
        publish: Publish,
        *,
        limits: coverage.Limits | None = None,
        ca_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 1.0,
    ) -> None:
        self.ingress = parse_url(url)
        self.node = node
        self._token = token
        self._targets = targets
        self._publish = publish
        self.limits = limits or coverage.Limits()
        self._ca_file = ca_file
        self._clock = clock
        self._tick = tick
        self.streams: dict[int, _Stream] = {}
        self._opening = 0
        self._ids = 0
        self._ssl: ssl.SSLContext | None = None
        self._sockets = _Sockets()
        self.known: set[str] = set()
        self.memory = coverage.Memory()
        self.actions: collections.Counter[str] = collections.Counter()
        self._retries = Retries(OPEN_BACKOFF)
        self._retry_at = 0.0
        self._published: Tunnel | None = None
        self._published_at = -1e9
        self._reachable_since = time.time()
        self._tasks: anyio.abc.TaskGroup | None = None

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                while True:
                    await self.tick_once()
                    await anyio.sleep(self._tick)
        finally:
            self._sockets.close()

    @property
    def reachable(self) -> bool:
        return any(s.replica for s in self.streams.values())

    async def tick_once(self) -> None:
        """One sizing tick (seed 003): plan from the streams per replica, carry it out,
        keep idle streams alive, publish the table."""
        now = self._clock()
        landed = [s for s in self.streams.values() if s.replica and not s.closing]
        views = [
            coverage.Stream(
                id=s.id,
                replica=s.replica,
                busy=s.busy,
                opened_at=s.opened_at,
                last_used=s.last_used,
            )
            for s in landed
        ]
        plan = coverage.plan(views, self.known, self.memory, now, self.limits)
        self.memory = plan.memory
        backing_off = now < self._retry_at
        # Counted as carried out: while opens back off, growth and fills are not.
        self.actions.update(
            {a: n for a, n in plan.actions.items() if not (backing_off and a in ("grow", "fill"))}
        )
        for sid in plan.close:
            stream = self.streams.get(sid)
            if stream is not None and not stream.busy:
                self._close(stream)
        opens = max(0, plan.open - self._opening)
        if opens and not backing_off and self._tasks is not None:
            for _ in range(opens):
                self._tasks.start_soon(self._open_stream)
        await self._publish_table(plan, now)

    def _close(self, stream: _Stream) -> None:
        """Ask the replica to take the stream out of use (DRAIN); it is closed once the
        replica answers DRAINED, after any exchange that took it meanwhile."""
        stream.closing = True
        if self._tasks is not None:

            async def drain() -> None:
                with contextlib.suppress(Exception):
                    await stream.send(wire.DRAIN_MESSAGE)

            self._tasks.start_soon(drain)

    async def _publish_table(self, plan: coverage.Plan, now: float) -> None:
        reachable = self.reachable
        table = Tunnel(
            reachable=reachable,
            replicas=[
                ReplicaCoverage(
                    replica=r.replica,
                    streams=r.streams,
                    busy=r.busy,
                    budget=r.budget,
                    state=str(r.state),
                )
                for r in plan.replicas
            ][:256],
            since=self._reachable_since,
            actions=dict(self.actions),
        )
        last = self._published
        if last is not None and last.reachable != reachable:
            self._reachable_since = time.time()
            table = table.model_copy(update={"since": self._reachable_since})
        shape_changed = last is None or _shape(last) != _shape(table)
        if not shape_changed and (last == table or now - self._published_at < PUBLISH_EVERY):
            return
        try:
            await self._publish(table)
        except Exception as exc:  # the store is away: the next tick tries again
            log.warning("could not publish the tunnel table: %s", exc)
            return
        self._published = table
        self._published_at = now

    # -- streams -------------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext | None:
        if not self.ingress.secure:
            return None
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self._ca_file)
        return self._ssl

    async def _open_stream(self) -> None:
        if len(self.streams) + self._opening >= self.limits.node_cap:
            return
        self._opening += 1
        self._ids += 1
        sid = self._ids
        stream = _Stream(sid, self._clock())
        self.streams[sid] = stream
        try:
            try:
                stream.connection = await connect(
                    self.ingress.url,
                    additional_headers={
                        "Authorization": f"Bearer {self._token}",
                        wire.NODE_HEADER: self.node,
                    },
                    ssl=self._context(),
                    **WS_OPTIONS,
                )
                await stream.send(wire.hello({"node": self.node}))
                async with asyncio.timeout(15):
                    answer = await stream.recv()
                if answer is None:
                    raise wire.WireError("the replica closed the stream at once")
                fields = wire.read_hello(answer)
            except (OSError, TimeoutError, websockets.WebSocketException, wire.WireError) as exc:
                self._opening -= 1
                self._failed(exc)
                return
            replica = fields.get("replica")
            if not isinstance(replica, str) or not replica:
                self._opening -= 1
                self._failed(wire.WireError("the replica's hello names no replica"))
                return
            peers = fields.get("replicas")
            if isinstance(peers, list):
                self.known = {p for p in peers if isinstance(p, str) and p} | {replica}
            stream.replica = replica
            stream.opened_at = stream.last_used = self._clock()
            self._opening -= 1
            self._retries.succeeded()
            await self._carry(stream)
        except asyncio.CancelledError:
            raise
        except (websockets.ConnectionClosed, OSError) as exc:
            if not stream.closing:
                log.info("tunnel stream %d to %s ended: %s", sid, stream.replica, exc)
        except Exception as exc:
            log.warning("tunnel stream %d to %s ended: %s", sid, stream.replica, exc)
        finally:
            self.streams.pop(sid, None)
            if stream.connection is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await stream.connection.close()

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, websockets.InvalidStatus) and exc.response.status_code == 503:
            # The replica the balancer chose is full for this node, or starting: the next
            # stream may land elsewhere, and coverage decides how many to try.
            log.info("a tunnel stream was refused for now: %s", _why(exc))
            return
        pause = self._retries.failed()
        self._retry_at = self._clock() + pause
        refused = isinstance(exc, websockets.InvalidStatus) and exc.response.status_code in (
            401,
            403,
        )
        log.log(
            logging.ERROR if refused else logging.WARNING,
            "could not open a tunnel stream to %s: %s; retrying in %.1f s",
            self.ingress.url,
            _why(exc),
            pause,
        )

    async def _carry(self, stream: _Stream) -> None:
        """Serve the stream's exchanges until it ends."""
        while True:
            message = await stream.recv()
            if not message:
                return
            kind = message[0]
            if kind == wire.DRAINED:
                return  # out of use on the replica: closed in `_open_stream`
            if kind != wire.CONNECT:
                raise wire.WireError(f"message kind {kind!r} on an idle stream")
            stream.busy = True
            try:
                await self._exchange(stream, message)
            finally:
                stream.busy = False
                stream.last_used = self._clock()

    async def _exchange(self, stream: _Stream, first: bytes) -> None:
        """One exchange: a socket to the sandbox it names, bytes both ways, until END."""
        tag, sandbox, data = wire.read_connect(first)
        sock = await self._connect(sandbox)
        if sock is None:
            reason = f"node {self.node!r} cannot reach sandbox {sandbox!r}"
            await stream.send(wire.refused(tag, reason))
            await self._until_end(stream)
            return
        if data:
            await sock.write(data)
        state = {"sending": False, "stop": False, "dirty": False}

        async def upward() -> None:
            while True:
                chunk = await sock.read()
                if state["stop"]:
                    state["dirty"] = True  # bytes after the answer: the socket is spoiled
                    return
                last = not chunk or (sock.eof and not sock.received.size)
                if not chunk:
                    message = wire.answer(wire.FIN, tag)
                elif last:  # the answer and the close in one message (an HTTP/1.0 sandbox)
                    message = wire.answer(wire.DATA_FIN, tag, chunk)
                else:
                    message = wire.answer(wire.DATA, tag, chunk)
                state["sending"] = True
                try:
                    await stream.send(message)
                finally:
                    state["sending"] = False
                if last or state["stop"]:
                    return

        pump = asyncio.get_running_loop().create_task(upward())
        reuse = False
        try:
            while True:
                message = await stream.recv()
                if not message:
                    raise wire.WireError("the stream ended mid-exchange")
                kind = message[0]
                if kind == wire.DATA:
                    await sock.write(message[1:])
                elif kind == wire.END:
                    reuse = message[1:] == b"1"
                    break
                else:
                    raise wire.WireError(f"message kind {kind!r} during an exchange")
        finally:
            state["stop"] = True
            if not state["sending"]:
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
            if reuse and not state["dirty"]:
                self._sockets.keep(sandbox, sock)  # it checks the sandbox kept quiet
            else:
                sock.close()

    async def _until_end(self, stream: _Stream) -> None:
        """After a REFUSED: the request's bytes are dropped until its END."""
        while True:
            message = await stream.recv()
            if not message:
                raise wire.WireError("the stream ended mid-exchange")
            if message[0] == wire.END:
                return

    async def _connect(self, sandbox: str) -> _Socket | None:
        target = self._targets(sandbox)
        if target is None:
            return None
        kept = self._sockets.take(sandbox)
        if kept is not None:
            return kept
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, sock = await loop.create_connection(_Socket, target[0], target[1])
        except (OSError, TimeoutError):
            return None
        return sock


def _shape(table: Tunnel) -> tuple[Any, ...]:
    """What makes a table worth publishing at once: reachability, replicas, their streams
    and states (busy counts alone wait for PUBLISH_EVERY)."""
    return (
        table.reachable,
        tuple((r.replica, r.streams, r.state) for r in table.replicas),
    )


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
