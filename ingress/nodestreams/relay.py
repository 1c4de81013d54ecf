"""Relays between replicas: a request reaches a replica where its node's streams are missing or
busy, and another replica has one.

- **Out** (`relay_to`, on the replica the client reached): a WebSocket to the peer's recorded
  address (`/v1/relay`, with an ingress token, the node, and how long the peer may wait for
  one of its streams to free). The peer answers ACCEPTED once it has given the relay a stream,
  or REFUSED; accepted, the relay call is the link of an `Exchange`, and its reader hands the
  answers to it. The request keeps its lease here: the lease is taken and handed back exactly
  once, by the replica the client reached.
- **In** (`serve_relay`, on the peer): take a stream of the node (waiting as long as the relay
  asks, within `tunnel_wait`), then carry the relayed exchange on it under a tag of this
  stream's own, the node's answers queued for the relay (`_Forward`: at most `FORWARD_QUEUE`
  messages, then the stream's reader waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import websockets
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers

from wakeful.domain import tunnelwire as wire
from wakeful.domain.models import IngressReplica
from wakeful.ingress.nodestreams.connections import WS_OPTIONS, receive, spawn
from wakeful.ingress.nodestreams.exchange import Exchange, TunnelClosed
from wakeful.ingress.nodestreams.hub import StreamHub
from wakeful.ingress.nodestreams.metrics import TunnelCounts

log = logging.getLogger(__name__)

FORWARD_QUEUE = 16
"""Messages (of at most `wire.MAX_MESSAGE`) a relay holds for a slow peer before it stops
reading the node's stream."""
RELAY_OPEN = 5.0
"""Seconds a relay's connection to a peer may take to open."""
RELAY_CONNECT_WAIT = 10.0
"""Seconds a replica that accepted a relay waits for its CONNECT before it takes the stream
back."""


async def relay_to(
    peer: IngressReplica,
    node: str,
    sandbox: str,
    protocol: asyncio.Protocol,
    *,
    token: str,
    wait: float,
    deadline: float,
    counts: TunnelCounts,
) -> Exchange | None:
    """The exchange through `peer` once it has given it a stream of the node (it waits
    up to `wait` seconds for one), or None when it has none, or cannot be reached
    before `deadline` (on the loop's clock). `token`: this replica's ingress token."""
    if _left(deadline) <= 0:
        return None
    headers = {
        "Authorization": f"Bearer {token}",
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
            spawn(call.close())
        raise
    if call is None:
        return None
    if answer != wire.ACCEPTED_MESSAGE:
        spawn(call.close())
        return None
    link = _RelayLink(call, f"the tunnel of node {node!r} relayed to {peer.name!r}")
    exchange = Exchange(link, sandbox, protocol, lambda: spawn(call.close()))
    counts.relayed += 1

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
            spawn(call.close())

    spawn(read())
    return exchange


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


async def serve_relay(
    connection: ServerConnection,
    headers: Headers,
    *,
    hub: StreamHub,
    longest: float,
    counts: TunnelCounts,
) -> None:
    """A peer's relay: give it an idle stream of the node here (waiting as long as it
    asks, at most `longest` seconds: `tunnel_wait`), answer ACCEPTED, then carry its
    exchange under a tag of this stream's own; REFUSED at once when there is none."""
    node = headers.get(wire.NODE_HEADER, "")
    if not node:
        await connection.close(1008, "a relay names no node")
        return
    try:
        wait = min(longest, max(0.0, float(headers.get(wire.WAIT_HEADER, "0"))))
    except ValueError:
        wait = 0.0
    stream = hub.try_take(node) if wait <= 0 else await hub.take(node, wait)
    if stream is None:
        await connection.send(wire.refused(0, f"node {node!r} has no free stream here"))
        return
    counts.relayed_in += 1
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
            hub.idle(stream)


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())
