"""The ingress replica's end of the tunnels that dial-out nodes open (seed 003).

A node behind NAT cannot be dialed, so it dials out: `wakeful node` with `WAKEFUL_TUNNEL`
opens streams (one WebSocket each) through the load balancer to the ingress tier, and the
balancer places each stream on a replica of its choosing. This module is what a replica does
with the streams that land on it (`wakeful.domain.tunnelwire` is the protocol):

- **Accept** (`Tunnels.serve`, a WebSocket listener on `tunnel_listen`): a stream must carry a
  node token (`authorization: Bearer ...`, checked against the store's digests by a
  `TokenBook`), then says which node it serves. It joins that node's streams on this replica
  (`StreamHub`), at most `tunnel_streams_per_node` of them.
- **Carry** (`TunnelDialer`, the upstream transport's dialer for `tunnel://NODE/SANDBOX`
  addresses): a request for the node's sandbox takes the node's newest idle stream *here*, and
  the stream becomes the request's connection (`Exchange`, an `asyncio.Transport`), so the
  upstream transport writes and parses HTTP over it exactly as over TCP: retries, bounds,
  timeouts and WebSockets all stay as they are. One stream carries one exchange at a time.
- **Relay**: a replica where the node holds no stream (the public balancer sent the request
  to a replica the node's streams did not land on), or holds only busy ones while another
  replica has idle ones, relays the exchange to a replica that does, found through the node's
  coverage table (`nodes/{node}`) and the replicas' own records (`ingresses/{replica}`,
  which this module writes for itself, bound to a TTL lease). A relay is authenticated with
  an ingress token. The request keeps its lease here: the lease is taken and handed back
  exactly once, by the replica the client reached.

Nothing reaches a node's sandbox through a replica without the node's credential, and no
address a node writes is ever dialed: a replica dials only its peers' recorded addresses.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import anyio
import websockets
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from wakeful.domain import keys
from wakeful.domain import tunnelwire as wire
from wakeful.domain.models import IngressReplica, Node, Role, Token
from wakeful.ingress.errors import ConnectFailed, UpstreamBusy
from wakeful.store import Item, Store
from wakeful.store.held import HeldRecord
from wakeful.store.reflector import Feed, reflect_all
from wakeful.store.tokenbook import TokenBook

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

HIGH_WATER = 256 * 1024
"""Request bytes queued for a stream before the writer is told to wait."""
RELAY_AFTER = 0.05
"""Seconds a request waits for one of its node's busy streams here before it asks a peer."""
FORWARD_QUEUE = 16
"""Messages (of at most `wire.MAX_MESSAGE`) a relay holds for a slow peer before it stops
reading the node's stream."""
OPEN_TIMEOUT = 3.0
"""Seconds a connection to the tunnel listener has to complete its upgrade request."""
RELAY_OPEN = 5.0
"""Seconds a relay's connection to a peer may take to open."""
RELAY_CONNECT_WAIT = 10.0
"""Seconds a replica that accepted a relay waits for its CONNECT before it takes the stream
back."""
WS_OPTIONS = wire.WEBSOCKET_OPTIONS


async def receive(connection: ServerConnection | ClientConnection) -> bytes | None:
    """The next message; None once the connection closed. Text is a protocol error."""
    try:
        message = await connection.recv()
    except websockets.ConnectionClosed:
        return None
    if not isinstance(message, bytes):
        raise wire.WireError("a text message on a tunnel")
    return message


class TunnelClosed(ConnectionResetError):
    """The stream (or the relay) carrying an exchange broke."""


# -- one exchange over a stream -----------------------------------------------------------------


class Link(Protocol):
    """Where an exchange's messages go: a node's stream, or a relay call to a peer."""

    what: str

    async def send(self, message: bytes) -> None: ...


class Receiver(Protocol):
    """What a stream's reader hands the messages of the exchange in progress to."""

    def on_message(self, message: bytes) -> None: ...

    def on_lost(self, exc: BaseException) -> None: ...

    def readable(self) -> bool: ...

    async def wait_readable(self) -> None: ...


class Exchange(asyncio.Transport):
    """One request's connection to a sandbox, carried over a tunnel stream.

    To the upstream transport's protocol it is a TCP connection: `write`, `close`, `abort`,
    flow control both ways. `release(reuse)` ends it as a pooled connection would be given
    back (the node may keep its socket to the sandbox for the next exchange). When it ends,
    END goes to the node after whatever was queued (nothing after an abort); `on_over` runs
    once END is sent (the stream is free: the node reads END before anything after it), or at
    once if nothing was ever sent. Answers carrying another exchange's tag are dropped."""

    def __init__(
        self,
        link: Link,
        sandbox: str,
        protocol: asyncio.Protocol,
        on_over: Callable[[], None],
        tag: int = 0,
    ) -> None:
        super().__init__()
        self.tag = tag
        self._loop = asyncio.get_running_loop()
        self._link = link
        self._sandbox = sandbox
        self._protocol: asyncio.Protocol | None = protocol
        self._on_over: Callable[[], None] | None = on_over
        self._outbox: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._high = HIGH_WATER
        self._writing_paused = False
        self._connect_sent = False
        self._end: bool | None = None
        self._end_sent = False
        self._pump: asyncio.Task[None] | None = None
        self._reading = asyncio.Event()
        self._reading.set()
        protocol.connection_made(self)

    # -- asyncio.Transport ------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._protocol is None or self._end is not None or not data:
            return
        self._outbox.append(bytes(data))
        self._queued += len(data)
        if not self._writing_paused and self._queued > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()
        self._kick()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self._protocol is None

    def close(self) -> None:
        protocol = self._detach()
        if protocol is not None:
            self._finish(reuse=False)
            self._loop.call_soon(protocol.connection_lost, None)

    def abort(self) -> None:
        protocol = self._detach()
        if protocol is not None:
            self._outbox.clear()
            self._queued = 0
            self._finish(reuse=False)
            self._loop.call_soon(protocol.connection_lost, None)

    def release(self, reuse: bool) -> None:
        """The exchange ended cleanly: no `connection_lost`; the node may keep its socket."""
        if self._detach() is not None:
            self._finish(reuse=reuse)

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is not None:
            self._high = high

    def get_write_buffer_size(self) -> int:
        return self._queued

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self._link.what, 0)
        return default

    # -- from the stream ----------------------------------------------------------------------

    def readable(self) -> bool:
        return self._reading.is_set() or self._protocol is None

    async def wait_readable(self) -> None:
        await self._reading.wait()

    def on_message(self, message: bytes) -> None:
        kind = message[0]
        if kind not in wire.ANSWERS or len(message) < 2:
            raise wire.WireError(f"unexpected message kind {kind!r} during an exchange")
        if message[1] != self.tag:
            return  # an answer of an exchange this stream carried before: dropped
        protocol = self._protocol
        if protocol is None:
            return
        if kind == wire.DATA:
            protocol.data_received(message[2:])
        elif kind == wire.REFUSED:
            reason = message[2:].decode(errors="replace")
            self._lost(ConnectFailed(f"{self._link.what}: {reason}"))
        else:  # FIN, DATA_FIN
            if kind == wire.DATA_FIN:
                protocol.data_received(message[2:])
            if self._protocol is not None:  # it may have ended the exchange itself
                protocol.eof_received()
                self._lost(None)

    def on_lost(self, exc: BaseException) -> None:
        """The stream broke: the exchange with it."""
        self._on_over = None  # the stream is gone: nothing goes back to the idle list
        if self._protocol is not None:
            if self._connect_sent:
                self._lost(TunnelClosed(f"{self._link.what} broke: {exc}"))
            else:  # nothing was sent: nothing reached the sandbox
                self._lost(ConnectFailed(f"{self._link.what} broke before the request: {exc}"))
        if self._pump is not None:
            self._pump.cancel()

    # -- internals ----------------------------------------------------------------------------

    def _detach(self) -> asyncio.Protocol | None:
        protocol, self._protocol = self._protocol, None
        self._reading.set()
        return protocol

    def _lost(self, exc: Exception | None) -> None:
        protocol = self._detach()
        if protocol is not None:
            self._finish(reuse=False)
            protocol.connection_lost(exc)

    def _finish(self, reuse: bool) -> None:
        if self._end is not None:
            return
        self._end = reuse
        if not self._connect_sent and not self._outbox:
            self._over()  # nothing reached the stream: it is idle as it was
        else:
            self._kick()

    def _over(self) -> None:
        on_over, self._on_over = self._on_over, None
        if on_over is not None:
            on_over()

    def _kick(self) -> None:
        if self._pump is None or self._pump.done():
            self._pump = self._loop.create_task(self._send_queued())

    async def _send_queued(self) -> None:
        try:
            while self._outbox:
                parts: list[bytes] = []
                size = 0
                while self._outbox and size < wire.CHUNK:
                    part = self._outbox.popleft()
                    parts.append(part)
                    size += len(part)
                payload = b"".join(parts)
                self._queued -= len(payload)
                for start in range(0, len(payload), wire.CHUNK):
                    piece = payload[start : start + wire.CHUNK]
                    if self._connect_sent:
                        await self._link.send(wire.data(piece))
                    else:
                        self._connect_sent = True
                        await self._link.send(wire.connect(self.tag, self._sandbox, piece))
                protocol = self._protocol
                if self._writing_paused and self._queued <= self._high // 4:
                    self._writing_paused = False
                    if protocol is not None:
                        protocol.resume_writing()
            if self._end is not None and not self._end_sent and self._connect_sent:
                self._end_sent = True
                await self._link.send(wire.end(self._end))
                self._over()  # END is on its way: the stream can carry the next exchange
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.on_lost(exc)


# -- a node's streams on this replica -------------------------------------------------------------


class NodeStream:
    """One stream a node opened to this replica: its reader loop, and the exchange it
    carries (None while idle)."""

    _ids = itertools.count(1)

    def __init__(
        self, hub: StreamHub, node: str, connection: ServerConnection, digest: str = ""
    ) -> None:
        self.id = next(self._ids)
        self.hub = hub
        self.node = node
        self.digest = digest
        """The sha256 of the token that opened it: revoked or rotated, the stream is closed."""
        self.draining = False
        """The node asked to close it (DRAIN): it carries no new exchange."""
        self.what = f"the tunnel of node {node!r} on ingress replica {hub.replica!r}"
        self._connection = connection
        self._lock = asyncio.Lock()
        self.receiver: Receiver | None = None
        self.opened_at = time.monotonic()
        self._tags = itertools.count(1)

    def next_tag(self) -> int:
        return next(self._tags) % 256

    async def send(self, message: bytes) -> None:
        async with self._lock:
            await self._connection.send(message)

    def close(self) -> None:
        _spawn(self._connection.close(1008, "its token was revoked"))

    def retire(self) -> None:
        """Out of use at the node's request: DRAINED tells the node nothing more comes, and
        the replica closes the connection itself (a stream out of the hub must not outlive
        its caps and its token's revocation because a node kept it open)."""
        self.hub.remove(self)

        async def drained() -> None:
            await self.send(wire.DRAINED_MESSAGE)
            await self._connection.close(1000, "drained")

        _spawn(drained())

    async def serve(self) -> None:
        """Read until the node closes the stream or it breaks; hand messages to the exchange."""
        error: BaseException = TunnelClosed("the node closed the stream")
        try:
            while True:
                receiver = self.receiver
                if receiver is not None and not receiver.readable():
                    await receiver.wait_readable()
                    continue
                message = await receive(self._connection)
                if not message:
                    return
                kind = message[0]
                if kind == wire.DRAIN:
                    self.draining = True
                    if self.receiver is None:  # idle: out of use at once; else at its end
                        self.retire()
                elif self.receiver is not None:
                    self.receiver.on_message(message)
                elif kind not in wire.ANSWERS:  # an answer to an exchange over: dropped
                    raise wire.WireError(f"message kind {kind!r} on an idle stream")
        except wire.WireError as exc:
            log.warning("%s: closed, it broke the protocol: %s", self.what, exc)
            error = exc
        except asyncio.CancelledError:
            error = TunnelClosed("the replica is stopping")
            raise
        except Exception as exc:
            error = exc
        finally:
            self.hub.remove(self)
            receiver, self.receiver = self.receiver, None
            if receiver is not None:
                receiver.on_lost(error)


@dataclass
class _NodeStreams:
    all: set[NodeStream] = field(default_factory=set)
    idle: list[NodeStream] = field(default_factory=list)
    """Idle streams, the most recently idle last: each exchange takes the newest, so the old
    ones stay idle and the node prunes them (seed 003)."""
    waiters: collections.deque[asyncio.Future[NodeStream]] = field(
        default_factory=collections.deque
    )


class StreamHub:
    """Every node's streams on this replica, idle and busy."""

    def __init__(self, replica: str, per_node: int, total: int) -> None:
        self.replica = replica
        self.per_node = per_node
        self.total = total
        self._nodes: dict[str, _NodeStreams] = {}
        self._count = 0

    def full(self, node: str) -> str | None:
        """Why one more stream of `node` is refused here, or None."""
        if self.holds(node) >= self.per_node:
            return f"node {node!r} holds {self.per_node} streams on replica {self.replica!r}"
        if self._count >= self.total:
            return f"replica {self.replica!r} holds {self.total} streams in all"
        return None

    def add(self, stream: NodeStream) -> bool:
        if self.full(stream.node) is not None:
            return False
        streams = self._nodes.setdefault(stream.node, _NodeStreams())
        streams.all.add(stream)
        self._count += 1
        self.idle(stream)
        return True

    def streams(self) -> list[NodeStream]:
        return [stream for streams in self._nodes.values() for stream in streams.all]

    def remove(self, stream: NodeStream) -> None:
        streams = self._nodes.get(stream.node)
        if streams is None or stream not in streams.all:
            return
        streams.all.discard(stream)
        self._count -= 1
        with contextlib.suppress(ValueError):
            streams.idle.remove(stream)
        if not streams.all and not streams.waiters:
            del self._nodes[stream.node]

    def idle(self, stream: NodeStream) -> None:
        """The stream finished its exchange (or just opened): the next waiter takes it."""
        stream.receiver = None
        streams = self._nodes.get(stream.node)
        if streams is None or stream not in streams.all:
            return
        if stream.draining:
            stream.retire()
            return
        while streams.waiters:
            waiter = streams.waiters.popleft()
            if not waiter.done():
                waiter.set_result(stream)
                return
        streams.idle.append(stream)

    def try_take(self, node: str) -> NodeStream | None:
        streams = self._nodes.get(node)
        if streams is None or not streams.idle:
            return None
        return streams.idle.pop()

    async def take(self, node: str, wait: float) -> NodeStream | None:
        """An idle stream of `node`, waiting up to `wait` seconds for one to free."""
        stream = self.try_take(node)
        if stream is not None:
            return stream
        streams = self._nodes.setdefault(node, _NodeStreams())
        waiter: asyncio.Future[NodeStream] = asyncio.get_running_loop().create_future()
        streams.waiters.append(waiter)
        try:
            async with asyncio.timeout(wait):
                return await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return waiter.result()  # granted in the very step the wait ran out
            return None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.idle(waiter.result())  # granted as it was cancelled: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                streams.waiters.remove(waiter)
            if not streams.all and not streams.waiters:
                self._nodes.pop(node, None)

    def holds(self, node: str) -> int:
        streams = self._nodes.get(node)
        return 0 if streams is None else len(streams.all)

    def counts(self) -> Iterator[tuple[str, int, int]]:
        """(node, streams, idle) for every node with streams here."""
        for node, streams in self._nodes.items():
            if streams.all:
                yield node, len(streams.all), len(streams.idle)


# -- what the replica knows of its peers and of the nodes' tables ---------------------------------


class _Records(Generic[M]):
    """A reflector view of one prefix: the records by name."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: dict[str, M] = {}

    def replace(self, items: list[Item[M]], revision: int) -> None:
        self.items = {keys.name_in(item.key, self.prefix): item.value for item in items}

    def put(self, item: Item[M]) -> None:
        self.items[keys.name_in(item.key, self.prefix)] = item.value

    def delete(self, key: str, revision: int) -> None:
        self.items.pop(keys.name_in(key, self.prefix), None)


class Peers:
    """The other replicas (`ingresses/`) and where each node's streams are (`nodes/`)."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.replicas: _Records[IngressReplica] = _Records(keys.INGRESSES)
        self.nodes: _Records[Node] = _Records(keys.NODES)

    def feeds(self) -> list[Feed[Any]]:
        return [
            Feed(keys.INGRESSES, IngressReplica, self.replicas),
            Feed(keys.NODES, Node, self.nodes),
        ]

    def known(self) -> list[str]:
        return sorted({self.replica, *self.replicas.items})

    def holding(self, node: str, *, idle_only: bool) -> list[IngressReplica]:
        """Peers where `node` holds streams (with idle ones, if asked), most idle first."""
        record = self.nodes.items.get(node)
        if record is None or record.tunnel is None:
            return []
        found = []
        for coverage in record.tunnel.replicas:
            peer = self.replicas.items.get(coverage.replica)
            idle = coverage.streams - coverage.busy
            if coverage.replica == self.replica or peer is None or coverage.streams == 0:
                continue
            if idle_only and idle <= 0:
                continue
            found.append((idle, peer))
        found.sort(key=lambda pair: -pair[0])
        return [peer for _, peer in found]


# -- relays between replicas ---------------------------------------------------------------------


class _RelayLink:
    """A relay call to a peer, as the link an `Exchange` writes to."""

    def __init__(self, connection: ClientConnection, what: str) -> None:
        self._connection = connection
        self.what = what
        self._lock = asyncio.Lock()

    async def send(self, message: bytes) -> None:
        async with self._lock:
            await self._connection.send(message)


class _Forward:
    """On the replica relayed to: the node's answers to the relayed exchange (its tag),
    queued for the peer."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self.tag: int | None = None
        """The exchange's tag on the node's stream here."""
        self.peer_tag = 0
        """...and on the relay: answers are passed on under it."""

    def on_message(self, message: bytes) -> None:
        if message[0] not in wire.ANSWERS or len(message) < 2:
            raise wire.WireError(f"unexpected message kind {message[0]!r} during an exchange")
        if message[1] != self.tag:
            return
        self.queue.put_nowait(bytes((message[0], self.peer_tag)) + message[2:])
        if self.queue.qsize() >= FORWARD_QUEUE:
            self._room.clear()

    def on_lost(self, exc: BaseException) -> None:
        self.queue.put_nowait(exc)
        self._room.set()

    def readable(self) -> bool:
        return self._room.is_set()

    async def wait_readable(self) -> None:
        await self._room.wait()

    def release(self) -> None:
        """The relay is over: the stream's reader must not wait on this queue any more."""
        self._room.set()

    async def get(self) -> bytes | BaseException:
        item = await self.queue.get()
        if self.queue.qsize() < FORWARD_QUEUE // 2:
            self._room.set()
        return item


# -- the replica's tunnel service ------------------------------------------------------------------


@dataclass
class TunnelCounts:
    local: int = 0
    relayed: int = 0
    relayed_in: int = 0
    unreachable: int = 0
    refused_streams: int = 0


class Tunnels:
    """The tunnel side of one ingress replica: its listener, its streams, its peers."""

    def __init__(
        self,
        store: Store,
        *,
        replica: str,
        advertise: str,
        per_node: int,
        total: int = 16_384,
        wait: float,
        ingress_token: str | None,
        registry: CollectorRegistry | None = None,
        record_ttl: int = 10,
    ) -> None:
        self._store = store
        self.replica = replica
        self.advertise = advertise
        self.hub = StreamHub(replica, per_node, total)
        self.peers = Peers(replica)
        self.tokens = TokenBook()
        self._wait = wait
        self._ingress_token = ingress_token
        self._record_ttl = record_ttl
        self.counts = TunnelCounts()
        self.synced = anyio.Event()
        self._listed: set[str] = set()
        if registry is not None:
            registry.register(_TunnelCollector(self))

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow tokens, peers and nodes; keep this replica's record; close the streams of
        revoked tokens; until cancelled."""
        async with anyio.create_task_group() as tasks:
            for feed in (Feed(keys.TOKENS, Token, self.tokens), *self.peers.feeds()):
                tasks.start_soon(self._follow, feed)  # a watch each: no common prefix
            tasks.start_soon(self._register)
            tasks.start_soon(self._close_revoked)

    async def serve(self, sock: Any) -> Server:
        """The tunnel listener on `sock` (bound and listening): `/v1/tunnel` for nodes'
        streams, `/v1/relay` for peers' relays."""
        return await serve(
            self._handle,
            sock=sock,
            process_request=self._check,
            open_timeout=OPEN_TIMEOUT,
            **WS_OPTIONS,
        )

    async def _follow(self, feed: Feed[Any]) -> None:
        def listed() -> None:
            self._listed.add(feed.prefix)
            if len(self._listed) == 3:
                self.synced.set()

        await reflect_all(
            self._store, [feed], what=f"ingress tunnels ({feed.prefix})", listed=listed
        )

    async def _register(self) -> None:
        record = HeldRecord(
            self._store,
            keys.ingress(self.replica),
            IngressReplica(name=self.replica, relay=self.advertise, since=time.time()),
            ttl=self._record_ttl,
            what=f"ingress replica {self.replica}",
        )
        try:
            await record.run()
        finally:
            await record.release(within=2)  # gone at once, so no peer relays here any more

    async def _close_revoked(self) -> None:
        """A stream lives only as long as the token that opened it (invariant 17)."""
        while True:
            await anyio.sleep(1)
            for stream in self.hub.streams():
                token = self.tokens.by_digest(stream.digest)
                if token is None or not _may_serve(token, stream.node):
                    log.warning("%s: closed, its token was revoked or rotated", stream.what)
                    self.hub.remove(stream)
                    stream.close()

    # -- the dialer's side: an exchange for a sandbox of a tunnelled node ----------------------

    async def dial(self, node: str, sandbox: str, protocol: asyncio.Protocol) -> Exchange:
        """A connection to `sandbox` on `node` through one of its streams: here if one is
        idle or frees within `RELAY_AFTER`; else through a peer that has one idle now (it
        answers at once, yes or no); else here once one frees; else, when the node holds none
        here, through the peer holding the most, waiting there. All of it within
        `tunnel_wait`. UpstreamBusy (503) when every stream stayed busy; ConnectFailed when
        the node holds no stream anywhere (it is unreachable)."""
        deadline = asyncio.get_running_loop().time() + self._wait
        stream = self.hub.try_take(node)
        if stream is None and self.hub.holds(node):
            # A stream here frees within a request's time, usually: a relay costs a connection
            # to the peer, and relays both ways would take each other's streams.
            stream = await self.hub.take(node, RELAY_AFTER)
        if stream is None:
            for peer in self.peers.holding(node, idle_only=True):
                exchange = await self._relay(peer, node, sandbox, protocol, 0, deadline)
                if exchange is not None:
                    return exchange
            if self.hub.holds(node):
                stream = await self.hub.take(node, _left(deadline))
                if stream is None:
                    raise UpstreamBusy(
                        f"every stream of node {node!r} on ingress replica {self.replica!r} "
                        f"stayed busy for {self._wait:g} s",
                        retry_after=1,
                    )
            else:
                peers = self.peers.holding(node, idle_only=False)
                for peer in peers:
                    wait = _left(deadline)
                    exchange = await self._relay(peer, node, sandbox, protocol, wait, deadline)
                    if exchange is not None:
                        return exchange
                if not peers:
                    self.counts.unreachable += 1
                    raise ConnectFailed(
                        f"node {node!r} holds no tunnel stream on any ingress replica: "
                        "it is unreachable until it connects again"
                    )
                raise UpstreamBusy(
                    f"no replica holding a stream of node {node!r} had one free within "
                    f"{self._wait:g} s",
                    retry_after=1,
                )
        self.counts.local += 1
        return self._exchange_on(stream, sandbox, protocol)

    def _exchange_on(self, stream: NodeStream, sandbox: str, protocol: Any) -> Exchange:
        exchange = Exchange(
            stream, sandbox, protocol, lambda: self.hub.idle(stream), stream.next_tag()
        )
        stream.receiver = exchange
        return exchange

    async def _relay(
        self,
        peer: IngressReplica,
        node: str,
        sandbox: str,
        protocol: asyncio.Protocol,
        wait: float,
        deadline: float,
    ) -> Exchange | None:
        """The exchange through `peer` once it has given it a stream of the node (it waits
        up to `wait` seconds for one), or None when it has none, or cannot be reached
        before `deadline`."""
        if self._ingress_token is None or _left(deadline) <= 0:
            return None
        headers = {
            "Authorization": f"Bearer {self._ingress_token}",
            wire.NODE_HEADER: node,
            wire.WAIT_HEADER: f"{wait:g}",
        }
        call: ClientConnection | None = None
        try:
            async with asyncio.timeout(min(_left(deadline), RELAY_OPEN)):
                call = await connect(
                    f"ws://{peer.relay}{wire.RELAY}", additional_headers=headers, **WS_OPTIONS
                )
            async with asyncio.timeout(max(0.0, _left(deadline)) + 1):
                answer = await receive(call)
        except (TimeoutError, OSError, websockets.WebSocketException, wire.WireError) as exc:
            log.info("relay to %s for node %r failed: %s", peer.name, node, exc)
            answer = None
        except BaseException:
            if call is not None:  # cancelled (the client left): the peer's stream goes back
                _spawn(call.close())
            raise
        if call is None:
            return None
        if answer != wire.ACCEPTED_MESSAGE:
            _spawn(call.close())
            return None
        link = _RelayLink(call, f"the tunnel of node {node!r} relayed to {peer.name!r}")
        exchange = Exchange(link, sandbox, protocol, lambda: _spawn(call.close()))
        self.counts.relayed += 1

        async def read() -> None:
            try:
                while True:
                    if not exchange.readable():
                        await exchange.wait_readable()
                        continue
                    message = await receive(call)
                    if not message:
                        exchange.on_lost(TunnelClosed(f"{peer.name!r} ended the relay"))
                        return
                    exchange.on_message(message)
            except asyncio.CancelledError:
                exchange.on_lost(TunnelClosed("the relay was cancelled"))
                raise
            except Exception as exc:
                exchange.on_lost(exc)
                _spawn(call.close())

        _spawn(read())
        return exchange

    # -- the listener's side ------------------------------------------------------------------

    def _credential(self, headers: Headers) -> Token | None:
        value = headers.get("Authorization", "")
        scheme, _, secret = value.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        return self.tokens.verify(secret.strip())

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        """Before the upgrade: the path, a token of the role that path needs (a node's, named
        after the node it serves, for a stream; an ingress's for a relay), and room for one
        more stream; refused with 404, 401, 403 or 503 (with Retry-After) otherwise."""
        route = _route(request.path)
        wanted = {wire.OPEN: Role.NODE, wire.RELAY: Role.INGRESS}.get(route)
        if wanted is None:
            return connection.respond(404, "not a tunnel path\n")
        if not self.synced.is_set():
            return _busy(connection, f"replica {self.replica!r} is starting", 1)
        token = self._credential(request.headers)
        if token is None:
            return connection.respond(401, f"{route} needs a {wanted} token\n")
        if token.role not in (wanted, Role.ADMIN):
            return connection.respond(403, f"{route} needs a {wanted} token\n")
        if route == wire.OPEN:
            node = request.headers.get(wire.NODE_HEADER, "")
            if not _may_serve(token, node):
                return connection.respond(
                    403, f"the token {token.name!r} opens streams only for node {token.name!r}\n"
                )
            full = self.hub.full(node)
            if full is not None:
                self.counts.refused_streams += 1
                return _busy(connection, full, 5)
        return None

    async def _handle(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None
        if _route(request.path) == wire.OPEN:
            await self.open(connection, request.headers)
        else:
            await self.relay_in(connection, request.headers)

    async def open(self, connection: ServerConnection, headers: Headers) -> None:
        """A node's stream: its hello, then serve it until it ends."""
        node = headers.get(wire.NODE_HEADER, "")
        token = self._credential(headers)
        try:
            async with asyncio.timeout(10):
                first = await receive(connection)
            fields = wire.read_hello(first or b"")
        except (TimeoutError, wire.WireError) as exc:
            await connection.close(1008, f"no valid hello: {exc}"[:120])
            return
        if fields.get("node") != node or token is None:
            await connection.close(1008, "the hello names another node than the request")
            return
        stream = NodeStream(self.hub, node, connection, token.sha256)
        await stream.send(wire.hello({"replica": self.replica, "replicas": self.peers.known()}))
        if not self.hub.add(stream):
            self.counts.refused_streams += 1
            await connection.close(1013, f"node {node!r} holds the cap of streams here")
            return
        await stream.serve()

    async def relay_in(self, connection: ServerConnection, headers: Headers) -> None:
        """A peer's relay: give it an idle stream of the node here (waiting as long as it
        asks, at most `tunnel_wait`), answer ACCEPTED, then carry its exchange under a tag of
        this stream's own; REFUSED at once when there is none."""
        node = headers.get(wire.NODE_HEADER, "")
        if not node:
            await connection.close(1008, "a relay names no node")
            return
        try:
            wait = min(self._wait, max(0.0, float(headers.get(wire.WAIT_HEADER, "0"))))
        except ValueError:
            wait = 0.0
        stream = self.hub.try_take(node) if wait <= 0 else await self.hub.take(node, wait)
        if stream is None:
            await connection.send(wire.refused(0, f"node {node!r} has no free stream here"))
            return
        self.counts.relayed_in += 1
        forward = _Forward()
        stream.receiver = forward
        connected = over = False
        to_peer: asyncio.Task[None] | None = None

        async def answers() -> None:
            while True:
                item = await forward.get()
                if isinstance(item, BaseException):
                    await connection.close(1011, "the node's stream broke")
                    return
                await connection.send(item)

        try:
            await connection.send(wire.ACCEPTED_MESSAGE)
            to_peer = asyncio.get_running_loop().create_task(answers())
            while True:
                limit = None if connected else RELAY_CONNECT_WAIT
                async with asyncio.timeout(limit):
                    message = await receive(connection)
                if not message:
                    break
                kind = message[0]
                if kind == wire.CONNECT and not connected:
                    # The peer's tag is its own; on this stream the exchange takes one of
                    # this stream's, so no answer of an earlier exchange here reaches it.
                    wire.read_connect(message)  # a malformed one ends the relay, not the stream
                    forward.peer_tag, forward.tag = message[1], stream.next_tag()
                    message = bytes((wire.CONNECT, forward.tag)) + message[2:]
                    connected = True
                elif not connected or kind not in (wire.DATA, wire.END):
                    raise wire.WireError(f"message kind {kind!r} in a relay")
                await stream.send(message)
                if kind == wire.END:
                    over = True
                    break
        except (TimeoutError, websockets.ConnectionClosed, wire.WireError) as exc:
            log.info("relay of node %r from a peer ended: %s", node, exc)
        finally:
            if to_peer is not None:
                to_peer.cancel()
            forward.release()
            if stream.receiver is forward:
                if connected and not over:  # the peer left mid-exchange: end it on the node
                    with contextlib.suppress(Exception):
                        await stream.send(wire.end(False))
                self.hub.idle(stream)


_background: set[asyncio.Task[Any]] = set()


def _spawn(coroutine: Any) -> None:
    """Run `coroutine` on its own, kept referenced until it ends; its errors are dropped."""

    async def quietly() -> None:
        with contextlib.suppress(Exception):
            await coroutine

    task = asyncio.get_running_loop().create_task(quietly())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())


def _may_serve(token: Token, node: str) -> bool:
    """A node token opens streams only for the node it is named after; admin for any."""
    return bool(node) and (token.role is Role.ADMIN or token.name == node)


def _busy(connection: ServerConnection, why: str, retry_after: int) -> Response:
    response = connection.respond(503, why + "\n")
    response.headers["Retry-After"] = str(retry_after)
    return response


def _route(path: str) -> str:
    """OPEN or RELAY, whatever prefix a balancer kept before it (`/edge/v1/tunnel`)."""
    path = path.partition("?")[0]
    for route in (wire.OPEN, wire.RELAY):
        if path.endswith(route):
            return route
    return path


class _TunnelCollector(Collector):
    def __init__(self, tunnels: Tunnels) -> None:
        self._tunnels = tunnels

    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "wakeful_ingress_tunnel_streams",
            "Streams dial-out nodes hold on this replica, by node and state (idle, busy)",
            labels=["node", "state"],
        )
        for node, total, idle in self._tunnels.hub.counts():
            streams.add_metric([node, "idle"], idle)
            streams.add_metric([node, "busy"], total - idle)
        yield streams
        counts = self._tunnels.counts
        requests = CounterMetricFamily(
            "wakeful_ingress_tunnel_requests",
            "Requests for tunnelled nodes' sandboxes, by path: on a stream here (local), "
            "relayed to the replica holding one (relayed), relayed here by a peer "
            "(relayed_in), or for a node with no stream anywhere (unreachable)",
            labels=["path"],
        )
        requests.add_metric(["local"], counts.local)
        requests.add_metric(["relayed"], counts.relayed)
        requests.add_metric(["relayed_in"], counts.relayed_in)
        requests.add_metric(["unreachable"], counts.unreachable)
        yield requests
        refused = CounterMetricFamily(
            "wakeful_ingress_tunnel_streams_refused",
            "Streams refused because their node held the cap of streams on this replica",
        )
        refused.add_metric([], counts.refused_streams)
        yield refused


def default_replica_name(listen: str) -> str:
    host = socket.gethostname().split(".")[0] or "ingress"
    port = listen.rpartition(":")[2]
    return f"{host}-{port}"
