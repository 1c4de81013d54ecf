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
from wakeful.ingress.nodestreams.decisions import GiveUp, Seen, Stage, TakeHere, Why, next_step
from wakeful.ingress.nodestreams.exchange import Exchange
from wakeful.ingress.nodestreams.hub import StreamHub
from wakeful.ingress.nodestreams.listener import Listener
from wakeful.ingress.nodestreams.metrics import TunnelCollector, TunnelCounts
from wakeful.ingress.nodestreams.peers import Peers, claim_name, hold_record
from wakeful.ingress.nodestreams.relay import relay_to
from wakeful.ingress.nodestreams.stream import NodeStream
from wakeful.store import Store
from wakeful.store.reflector import Feed, reflect_all
from wakeful.store.tokenbook import TokenBook


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

    async def claim(self) -> None:
        """Before it takes tunnels: wait out a record of this replica's name that another
        relay address holds (a previous run's), refused if a running twin holds it
        (`peers.claim_name`, `HolderRunning`)."""
        record = IngressReplica(name=self.replica, relay=self.advertise)
        await claim_name(self._store, record, self._record_ttl)

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
        """A connection to `sandbox` on `node` through one of its streams, here or relayed
        through a peer, within `tunnel_wait` (where to look, in which order: `decisions`).
        UpstreamBusy (503) when every stream stayed busy; ConnectFailed when the node holds
        no stream anywhere (it is unreachable)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        stage = Stage.FIRST
        while True:
            seen = Seen(
                here=self.hub.holds(node),
                idle_here=self.hub.idle_of(node),
                peers=self.peers.ranked(node),
                left=max(0.0, deadline - loop.time()),
                can_relay=self._ingress_token is not None,
            )
            step = next_step(stage, seen)
            if isinstance(step, GiveUp):
                raise self._no_stream(node, step.why)
            if isinstance(step, TakeHere):
                stream = await self.hub.take(node, step.wait)
                if stream is not None:
                    self.counts.local += 1
                    return self._exchange_on(stream, sandbox, protocol)
            else:
                token = self._ingress_token
                assert token is not None  # next_step relays only with one
                for peer in step.peers:  # the records as they were when the step was chosen
                    wait = max(0.0, deadline - loop.time()) if step.patient else 0.0
                    exchange = await relay_to(
                        peer,
                        node,
                        sandbox,
                        protocol,
                        token=token,
                        wait=wait,
                        deadline=deadline,
                        counts=self.counts,
                    )
                    if exchange is not None:
                        return exchange
            stage = step.then

    def _no_stream(self, node: str, why: Why) -> Exception:
        if why is Why.UNREACHABLE:
            self.counts.unreachable += 1
            return ConnectFailed(
                f"node {node!r} holds no tunnel stream on any ingress replica: "
                "it is unreachable until it connects again"
            )
        if why is Why.BUSY_HERE:
            return UpstreamBusy(
                f"every stream of node {node!r} on ingress replica {self.replica!r} "
                f"stayed busy for {self._wait:g} s",
                retry_after=1,
            )
        return UpstreamBusy(
            f"no replica holding a stream of node {node!r} had one free within {self._wait:g} s",
            retry_after=1,
        )

    def _exchange_on(self, stream: NodeStream, sandbox: str, protocol: Any) -> Exchange:
        exchange = Exchange(
            stream, sandbox, protocol, lambda: self.hub.idle(stream), stream.next_tag()
        )
        stream.receiver = exchange
        return exchange


def default_replica_name(listen: str) -> str:
    host = socket.gethostname().split(".")[0] or "ingress"
    port = listen.rpartition(":")[2]
    return f"{host}-{port}"
