"""The tunnel protocol on the replica side (`ingress.nodestreams`), driven by a hand-written
node: real `Tunnels` replicas on the memory store, their WebSocket listeners, and a raw
WebSocket standing in for the node, so the tests can send what a real node would only send
in a race (an answer of an exchange already over) or never (another node's name)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import websockets
from websockets.asyncio.client import ClientConnection, connect

from tests.support.waiting import eventually
from wakeful.domain import tunnelwire as wire
from wakeful.domain.models import Node, ReplicaCoverage, Role, Token, Tunnel
from wakeful.ingress.errors import ConnectFailed
from wakeful.ingress.nodestreams import WS_OPTIONS, NodeStream, StreamHub, Tunnels
from wakeful.store import Store, open_store
from wakeful.store.tokenbook import digest

pytestmark = pytest.mark.anyio

NODE_SECRET = "node-secret-for-protocol-tests"
OTHER_NODE_SECRET = "another-node-secret-for-tests"
INGRESS_SECRET = "ingress-secret-for-protocol-tests"


class Recorder(asyncio.Protocol):
    """What the upstream transport's protocol sees of an exchange."""

    def __init__(self, first: bytes = b"GET / HTTP/1.1\r\n\r\n") -> None:
        self.first = first
        self.data = b""
        self.lost: BaseException | str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.first:
            transport.write(self.first)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or "closed"


async def closes(connection: ClientConnection) -> bool:
    """Read until the replica closes the connection (True), within 10 s."""
    with anyio.fail_after(10):
        try:
            for _ in range(1000):
                await connection.recv()
        except websockets.ConnectionClosed:
            return True
    return False


@contextlib.asynccontextmanager
async def replicas(count: int = 2, wait: float = 5.0) -> AsyncIterator[tuple[Store, list[Tunnels]]]:
    async with open_store("memory://") as store:
        for name, secret, role in (
            ("n1", NODE_SECRET, Role.NODE),
            ("n2", OTHER_NODE_SECRET, Role.NODE),
            ("edge", INGRESS_SECRET, Role.INGRESS),
        ):
            token = Token(name=name, role=role, id="0123abcd", sha256=digest(secret))
            await store.put(f"tokens/{name}", token)
        found: list[Tunnels] = []
        servers = []
        async with anyio.create_task_group() as tasks:
            for number in range(count):
                sock = socket.create_server(("127.0.0.1", 0))
                address = f"127.0.0.1:{sock.getsockname()[1]}"
                tunnels = Tunnels(
                    store,
                    replica=f"r{number + 1}",
                    advertise=address,
                    per_node=1024,
                    wait=wait,
                    ingress_token=INGRESS_SECRET,
                )
                tasks.start_soon(tunnels.run)
                servers.append(await tunnels.serve(sock))
                found.append(tunnels)
            for tunnels in found:
                await tunnels.synced.wait()
            await eventually(lambda: all(len(t.peers.replicas.items) == count for t in found))
            yield store, found
            for server in servers:
                server.close()
            tasks.cancel_scope.cancel()


async def open_stream(
    tunnels: Tunnels, node: str = "n1", secret: str = NODE_SECRET, hello_node: str | None = None
) -> ClientConnection:
    """A stream as a node opens one, its hello answered."""
    connection = await connect(
        f"ws://{tunnels.advertise}{wire.OPEN}",
        additional_headers={"Authorization": f"Bearer {secret}", wire.NODE_HEADER: node},
        **WS_OPTIONS,
    )
    await connection.send(wire.hello({"node": hello_node or node}))
    answer = await connection.recv()
    assert isinstance(answer, bytes)
    assert wire.read_hello(answer)["replica"] == tunnels.replica
    return connection


async def table(store: Store, **streams: tuple[int, int]) -> None:
    """The node's coverage table, as it would publish it: replica -> (streams, busy)."""
    replicas = [
        ReplicaCoverage(replica=name, streams=total, busy=busy, budget=2, state="covered")
        for name, (total, busy) in streams.items()
    ]
    tunnel = Tunnel(reachable=True, replicas=replicas)
    await store.put("nodes/n1", Node(name="n1", address="", tunnel=tunnel))


async def received(connection: ClientConnection) -> bytes:
    message = await connection.recv()
    assert isinstance(message, bytes)
    return message


def idle(tunnels: Tunnels) -> int:
    return sum(free for _, _, free in tunnels.hub.counts())


@pytest.mark.parametrize("relayed", [False, True], ids=["on the replica", "through a relay"])
async def test_an_answer_of_an_exchange_already_over_never_reaches_the_next(
    relayed: bool,
) -> None:
    """A client hung up mid-answer; the node had sent more of that answer before it read the
    END. Those bytes carry the old exchange's tag and are dropped, so the next request, on the
    same stream, never sees another client's bytes (or a stale REFUSED: invariant 11)."""
    async with replicas() as (store, (r1, r2)):
        node = await open_stream(r1)
        await eventually(lambda: idle(r1) == 1)
        await table(store, r1=(1, 0))
        await eventually(lambda: r2.peers.holding("n1", idle_only=True))
        front = r2 if relayed else r1
        first = Recorder()
        exchange = await front.dial("n1", "sb-1", first)
        connect_1 = await received(node)
        assert connect_1[0] == wire.CONNECT
        await node.send(wire.answer(wire.DATA, connect_1[1], b"partial"))
        await eventually(lambda: first.data == b"partial")
        exchange.abort()
        assert await received(node) == wire.end(False)
        await eventually(lambda: idle(r1) == 1)
        second = Recorder()
        await front.dial("n1", "sb-1", second)
        connect_2 = await received(node)
        assert connect_2[0] == wire.CONNECT and connect_2[1] != connect_1[1]
        await node.send(wire.answer(wire.DATA, connect_1[1], b"LATE BYTES OF THE FIRST"))
        await node.send(wire.answer(wire.REFUSED, connect_1[1], b"stale"))
        await node.send(wire.answer(wire.DATA, connect_2[1], b"second"))
        await eventually(lambda: second.data == b"second")
        assert second.lost is None
        await node.close()


async def test_a_relay_cancelled_while_it_waits_gives_the_peer_its_stream_back() -> None:
    async with replicas(wait=5.0) as (store, (r1, r2)):
        node = await open_stream(r1)
        await eventually(lambda: idle(r1) == 1)
        busy = Recorder()
        await r1.dial("n1", "sb-1", busy)  # r1's only stream is busy
        connect_1 = await received(node)
        await table(store, r1=(1, 1))
        await eventually(lambda: r2.peers.holding("n1", idle_only=False))
        waiting = asyncio.ensure_future(r2.dial("n1", "sb-1", Recorder()))
        await eventually(lambda: r1.counts.relayed_in == 0 and len(r1.hub.streams()) == 1)
        await anyio.sleep(0.3)  # r2 is waiting at r1 for the stream
        waiting.cancel()  # its client hung up
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await node.send(wire.answer(wire.FIN, connect_1[1]))
        await eventually(lambda: busy.lost is not None)
        assert await received(node) == wire.end(False)
        # The stream is r1's to give again, whether or not the abandoned relay took it.
        await eventually(lambda: idle(r1) == 1)
        await anyio.sleep(RELAY_SETTLE)
        assert idle(r1) == 1
        await node.close()


RELAY_SETTLE = 0.5


async def test_a_stream_granted_in_the_step_its_wait_ends_is_not_lost() -> None:
    hub = StreamHub("r1", per_node=10, total=100)
    stream = NodeStream(hub, "n1", connection=None)  # type: ignore[arg-type]
    hub.add(stream)
    assert hub.try_take("n1") is stream  # carrying an exchange
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, hub.idle, stream)  # the exchange ends at 50 ms...
    loop.call_later(0.01, time.sleep, 0.1)  # ...while the loop is held past the wait's end
    taken = await hub.take("n1", 0.06)
    assert taken is stream


async def test_a_node_token_opens_streams_only_for_its_own_node() -> None:
    async with replicas(count=1) as (_, (r1,)):
        with pytest.raises(websockets.InvalidStatus) as refused:
            await open_stream(r1, node="n1", secret=OTHER_NODE_SECRET)
        assert refused.value.response.status_code == 403
        assert b"only for node 'n2'" in refused.value.response.body
        # A hello naming another node than the request is closed without serving.
        impostor = await connect(
            f"ws://{r1.advertise}{wire.OPEN}",
            additional_headers={"Authorization": f"Bearer {NODE_SECRET}", wire.NODE_HEADER: "n1"},
        )
        await impostor.send(wire.hello({"node": "n2"}))
        with pytest.raises(websockets.ConnectionClosed):
            await impostor.recv()
        assert r1.hub.streams() == []


async def test_the_streams_of_a_revoked_token_are_closed() -> None:
    async with replicas(count=1) as (store, (r1,)):
        node = await open_stream(r1)
        await eventually(lambda: len(r1.hub.streams()) == 1)
        await store.delete("tokens/n1")
        assert await closes(node)
        assert r1.hub.streams() == []
        with pytest.raises(websockets.InvalidStatus) as refused:
            await open_stream(r1)
        assert refused.value.response.status_code == 401


async def test_a_stream_the_node_drains_carries_the_exchange_it_took_then_leaves() -> None:
    async with replicas(count=1) as (_, (r1,)):
        node = await open_stream(r1)
        await eventually(lambda: idle(r1) == 1)
        crossing = Recorder()
        await r1.dial("n1", "sb-1", crossing)  # a request takes it as the node drains it
        await node.send(wire.DRAIN_MESSAGE)
        connect_1 = await received(node)
        assert connect_1[0] == wire.CONNECT
        await node.send(wire.answer(wire.DATA_FIN, connect_1[1], b"answer"))
        await eventually(lambda: crossing.data == b"answer" and crossing.lost is not None)
        assert await received(node) == wire.end(False)
        assert await received(node) == wire.DRAINED_MESSAGE  # only after the exchange
        assert await closes(node)  # by the replica: kept open, it would escape the caps
        assert r1.hub.streams() == []
        with pytest.raises(ConnectFailed):
            await r1.dial("n1", "sb-1", Recorder())
        await node.close()


async def test_garbage_from_a_node_closes_only_its_own_stream() -> None:
    async with replicas(count=1) as (_, (r1,)):
        good = await open_stream(r1)
        bad = await open_stream(r1)
        await eventually(lambda: idle(r1) == 2)
        message: Any
        for message in (b"Z", "text", wire.hello({"node": "n1"})):
            await bad.send(message)
        assert await closes(bad)
        await eventually(lambda: idle(r1) == 1)
        exchange_on = Recorder()
        await r1.dial("n1", "sb-1", exchange_on)
        assert (await received(good))[0] == wire.CONNECT
        await good.close()


async def test_a_relay_whose_client_stopped_reading_and_left_does_not_wedge_the_stream() -> None:
    """The relayed answer filled the relay's queue (its client stopped reading), then the
    client left: the stream's reader, waiting for room in that queue, must wake, or every
    later request on the stream would hang."""
    async with replicas() as (store, (r1, r2)):
        node = await open_stream(r1)
        await eventually(lambda: idle(r1) == 1)
        await table(store, r1=(1, 0))
        await eventually(lambda: r2.peers.holding("n1", idle_only=True))
        slow = Recorder()
        exchange = await r2.dial("n1", "sb-1", slow)
        exchange.pause_reading()  # the client does not read
        tag = (await received(node))[1]

        async def flood() -> None:  # until the relay's queue on r1 is full
            with contextlib.suppress(websockets.ConnectionClosed):
                for _ in range(2000):
                    await node.send(wire.answer(wire.DATA, tag, b"x" * 60_000))

        flooding = asyncio.ensure_future(flood())
        (stream,) = r1.hub.streams()
        await eventually(lambda: stream.receiver is not None and not stream.receiver.readable())
        exchange.abort()  # the client left
        flooding.cancel()
        assert await received(node) == wire.end(False)
        await eventually(lambda: idle(r1) == 1)
        after = Recorder()
        await r1.dial("n1", "sb-1", after)
        connect_2 = await received(node)
        await node.send(wire.answer(wire.DATA_FIN, connect_2[1], b"fine"))
        await eventually(lambda: after.data == b"fine")
        await node.close()
