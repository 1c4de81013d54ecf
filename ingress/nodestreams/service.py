"""`Tunnels`: the tunnel side of one ingress replica, wired: its listener, its streams, its
peers, and the dialer the upstream transport reaches `tunnel://NODE/SANDBOX` addresses with
(`dial`)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import anyio
from prometheus_client import CollectorRegistry
from websockets.asyncio.server import Server

from wakeful.domain import keys
from wakeful.domain.models import IngressReplica, Token
from wakeful.ingress.errors import ConnectFailed, UpstreamBusy
from wakeful.ingress.nodestreams.exchange import Exchange
from wakeful.ingress.nodestreams.hub import StreamHub
from wakeful.ingress.nodestreams.listener import Listener
from wakeful.ingress.nodestreams.metrics import TunnelCollector, TunnelCounts
from wakeful.ingress.nodestreams.peers import Peers, hold_record
from wakeful.ingress.nodestreams.relay import relay_to
from wakeful.ingress.nodestreams.stream import NodeStream
from wakeful.store import Store
from wakeful.store.reflector import Feed, reflect_all
from wakeful.store.tokenbook import TokenBook

RELAY_AFTER = 0.05
"""Seconds a request waits for one of its node's busy streams here before it asks a peer."""


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
        self.listener = Listener(
            replica=replica,
            hub=self.hub,
            peers=self.peers,
            tokens=self.tokens,
            counts=self.counts,
            synced=self.synced,
            wait=wait,
        )
        if registry is not None:
            registry.register(TunnelCollector(self.hub, self.counts))

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow tokens, peers and nodes; keep this replica's record; close the streams of
        revoked tokens; until cancelled."""
        record = IngressReplica(name=self.replica, relay=self.advertise, since=time.time())
        async with anyio.create_task_group() as tasks:
            for feed in (Feed(keys.TOKENS, Token, self.tokens), *self.peers.feeds()):
                tasks.start_soon(self._follow, feed)  # a watch each: no common prefix
            tasks.start_soon(hold_record, self._store, record, self._record_ttl)
            tasks.start_soon(self.listener.close_revoked)

    async def serve(self, sock: Any) -> Server:
        """The tunnel listener on `sock` (bound and listening): `/v1/tunnel` for nodes'
        streams, `/v1/relay` for peers' relays."""
        return await self.listener.serve(sock)

    async def _follow(self, feed: Feed[Any]) -> None:
        def listed() -> None:
            self._listed.add(feed.prefix)
            if len(self._listed) == 3:
                self.synced.set()

        await reflect_all(
            self._store, [feed], what=f"ingress tunnels ({feed.prefix})", listed=listed
        )

    # -- the dialer: an exchange for a sandbox of a tunnelled node ------------------------------

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
        if self._ingress_token is None:
            return None
        return await relay_to(
            peer,
            node,
            sandbox,
            protocol,
            token=self._ingress_token,
            wait=wait,
            deadline=deadline,
            counts=self.counts,
        )


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())


def default_replica_name(listen: str) -> str:
    host = socket.gethostname().split(".")[0] or "ingress"
    port = listen.rpartition(":")[2]
    return f"{host}-{port}"
