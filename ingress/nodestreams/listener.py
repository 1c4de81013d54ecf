"""The tunnel listener: the WebSocket server where nodes open their streams (`/v1/tunnel`) and
peers relay (`/v1/relay`).

Before the upgrade (`check`): the path, a token of the role that path needs (a node's, named
after the node it serves, for a stream; an ingress's for a relay; admin passes both), and room
for one more stream; refused with 404, 401, 403 or 503 (with Retry-After) otherwise. A stream
then says which node it serves (its hello must name the node its request did), and joins that
node's streams on this replica. A stream lives only as long as the token that opened it
(`close_revoked`, invariant 17).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from wakeful.domain import tunnelwire as wire
from wakeful.domain.models import Role, Token
from wakeful.ingress.nodestreams.connections import WS_OPTIONS, receive
from wakeful.ingress.nodestreams.hub import StreamHub
from wakeful.ingress.nodestreams.metrics import TunnelCounts
from wakeful.ingress.nodestreams.peers import Peers
from wakeful.ingress.nodestreams.relay import serve_relay
from wakeful.ingress.nodestreams.stream import NodeStream
from wakeful.store.tokenbook import TokenBook

log = logging.getLogger(__name__)

OPEN_TIMEOUT = 3.0
"""Seconds a connection to the tunnel listener has to complete its upgrade request."""


class Listener:
    """What the tunnel listener admits, and what it does with each connection it took."""

    def __init__(
        self,
        *,
        replica: str,
        hub: StreamHub,
        peers: Peers,
        tokens: TokenBook,
        counts: TunnelCounts,
        synced: anyio.Event,
        wait: float,
    ) -> None:
        """`synced`: set once tokens, peers and nodes are read (nothing is admitted before);
        `wait`: the longest a relay may wait here for a stream (`tunnel_wait`)."""
        self.replica = replica
        self.hub = hub
        self.peers = peers
        self.tokens = tokens
        self.counts = counts
        self.synced = synced
        self._wait = wait

    async def serve(self, sock: Any) -> Server:
        """The listener on `sock` (bound and listening)."""
        return await serve(
            self._handle,
            sock=sock,
            process_request=self.check,
            open_timeout=OPEN_TIMEOUT,
            **WS_OPTIONS,
        )

    async def close_revoked(self) -> None:
        """Every second, close the streams whose token was revoked or rotated; until
        cancelled."""
        while True:
            await anyio.sleep(1)
            for stream in self.hub.streams():
                token = self.tokens.by_digest(stream.digest)
                if token is None or not _may_serve(token, stream.node):
                    log.warning("%s: closed, its token was revoked or rotated", stream.what)
                    self.hub.remove(stream)
                    stream.close()

    def _credential(self, headers: Headers) -> Token | None:
        value = headers.get("Authorization", "")
        scheme, _, secret = value.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        return self.tokens.verify(secret.strip())

    def check(self, connection: ServerConnection, request: Request) -> Response | None:
        """Before the upgrade: None to go on, else the refusal (the rules above)."""
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
            await serve_relay(
                connection, request.headers, hub=self.hub, longest=self._wait, counts=self.counts
            )

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
