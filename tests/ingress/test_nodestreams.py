"""Requests over dial-out nodes' tunnels (seed 003): a real ingress (its tunnel listener,
its proxy, a real activator on the memory store) and a real node-side `TunnelClient` in one
process, carrying requests to a real hello sandbox process it alone knows the address of."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import httpx
import pytest
import websockets
from prometheus_client import CollectorRegistry
from websockets.asyncio.client import connect

from tests.support.ingress import Stack, stack
from tests.support.waiting import eventually
from wakeful.activator.client import InProcessLeases
from wakeful.domain import tunnelwire as wire
from wakeful.domain.models import Node, Role, Sandbox, SandboxStatus, Token, Tunnel
from wakeful.ingress import Ingress
from wakeful.node.tunnel.client import TunnelClient
from wakeful.store.tokenbook import digest

pytestmark = pytest.mark.anyio

NODE_SECRET = "node-secret-for-tunnel-tests"
INGRESS_SECRET = "ingress-secret-for-tunnel-tests"


@dataclass
class Tunnelled:
    s: Stack
    client: TunnelClient
    targets: dict[str, tuple[str, int]]

    @property
    def tunnel(self) -> str:
        host, port = self.s.ingress.tunnel_address
        return f"{host}:{port}"


async def _tokens(s: Stack) -> None:
    for name, secret, role in (
        ("n1", NODE_SECRET, Role.NODE),
        ("edge", INGRESS_SECRET, Role.INGRESS),
    ):
        token = Token(name=name, role=role, id="0123abcd", sha256=digest(secret))
        await s.store.put(f"tokens/{name}", token)


@contextlib.asynccontextmanager
async def tunnelled(
    sandboxes: dict[str, int], *, secret: str = NODE_SECRET, **settings: object
) -> AsyncIterator[Tunnelled]:
    """The stack with its sandboxes on node `n1`, which is reached only through its tunnel."""
    async with stack(None, tunnel_listen="127.0.0.1:0", tunnel_replica="r1", **settings) as s:
        await _tokens(s)
        assert s.ingress.tunnels is not None
        await s.ingress.tunnels.synced.wait()
        await eventually(
            lambda: (
                s.ingress.tunnels is not None and bool(s.ingress.tunnels.tokens.verify(NODE_SECRET))
            )
        )
        node = Node(name="n1", address="", tunnel=Tunnel())
        await s.store.put("nodes/n1", node)

        async def publish(table: Tunnel) -> None:
            await s.store.put("nodes/n1", node.model_copy(update={"tunnel": table}))

        targets = {sid: ("127.0.0.1", port) for sid, port in sandboxes.items()}
        host, port = s.ingress.tunnel_address
        client = TunnelClient(
            f"http://{host}:{port}", "n1", secret, targets.get, publish, tick=0.05
        )
        for sandbox_id in sandboxes:
            await s.store.put(
                f"sandboxes/{sandbox_id}",
                Sandbox(
                    id=sandbox_id,
                    pool="hello-v1",
                    app="hello",
                    node="n1",
                    status=SandboxStatus.RUNNING,
                    ready=True,
                    address=f"tunnel://n1/{sandbox_id}",
                ),
            )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.run)
            yield Tunnelled(s, client, targets)
            tasks.cancel_scope.cancel()


async def test_a_request_reaches_a_sandbox_only_its_node_can_dial(
    hello: Callable[[], int],
) -> None:
    async with tunnelled({"sb-1": hello()}) as t:
        await eventually(lambda: t.client.reachable)
        for _ in range(5):
            answer = await t.s.client.get("/")
            assert answer.status_code == 200, answer.text
            assert answer.text.startswith("hello from")
        body = bytes(range(256)) * 40_000  # 10 MB up, and the same back
        echoed = await t.s.client.post("/echo", content=body)
        assert echoed.status_code == 200
        assert echoed.content == body
        assert echoed.headers["x-body-sha256"] == hashlib.sha256(body).hexdigest()
        assert (
            t.s.registry.get_sample_value(
                "wakeful_ingress_tunnel_requests_total", {"path": "local"}
            )
            == 6
        )


async def test_a_client_that_hangs_up_mid_download_frees_the_stream_and_the_lease(
    hello: Callable[[], int],
) -> None:
    async with tunnelled({"sb-1": hello()}, lease_idle_ttl=0.3, maintenance_interval=0.05) as t:
        await eventually(lambda: t.client.reachable)
        async with t.s.client.stream("GET", f"/bytes?n={10**12}") as answer:
            received = 0
            async for chunk in answer.aiter_raw():
                received += len(chunk)
                if received > 4 << 20:
                    break
        # The abort travels: the ingress ends the exchange, the node closes its socket, and
        # the stream is idle again; the request's use goes back once.
        await eventually(lambda: t.s.activator.leased_on("sb-1") == 0)
        await eventually(lambda: not any(s.busy for s in t.client.streams.values()))
        tunnels = t.s.ingress.tunnels
        assert tunnels is not None  # and on the replica every stream is idle again
        await eventually(
            lambda: (
                all(total == free for _, total, free in tunnels.hub.counts())
                and tunnels.hub.holds("n1") > 0
            )
        )
        assert t.s.sample("requests_in_flight", app="hello") == 0
        again = await t.s.client.get("/")
        assert again.status_code == 200


async def test_a_sandbox_the_node_does_not_run_is_refused_and_nothing_is_sent_twice(
    hello: Callable[[], int],
) -> None:
    async with tunnelled({"sb-1": hello()}) as t:
        await eventually(lambda: t.client.reachable)
        t.targets.pop("sb-1")  # the node no longer runs it: nothing reached it
        answer = await t.s.client.get("/")
        assert answer.status_code == 502
        assert "cannot reach sandbox 'sb-1'" in answer.text
        await eventually(lambda: t.s.activator.leased_on("sb-1") == 0)


async def test_a_stream_without_a_node_token_is_refused(hello: Callable[[], int]) -> None:
    async with tunnelled({"sb-1": hello()}) as t:
        await eventually(lambda: t.client.reachable)
        for secret, status in ((None, 401), ("wrong", 401), (INGRESS_SECRET, 403)):
            headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
            with pytest.raises(websockets.InvalidStatus) as refused:
                await connect(f"ws://{t.tunnel}{wire.OPEN}", additional_headers=headers)
            assert refused.value.response.status_code == status
        headers = {"Authorization": f"Bearer {NODE_SECRET}"}
        with pytest.raises(websockets.InvalidStatus) as elsewhere:
            await connect(f"ws://{t.tunnel}/v1/apps", additional_headers=headers)
        assert elsewhere.value.response.status_code == 404
        assert t.s.ingress.tunnels is not None
        assert t.s.ingress.tunnels.hub.holds("n1") == len(
            [s for s in t.client.streams.values() if s.replica]
        )


async def test_a_node_with_no_stream_is_out_of_admission_until_it_has_one(
    hello: Callable[[], int],
) -> None:
    async with tunnelled({"sb-1": hello()}, secret="not-the-node-token") as t:
        await anyio.sleep(0.3)  # its streams are refused: it never becomes reachable
        assert not t.client.reachable
        assert not t.s.activator._view.routable("sb-1")
        async with anyio.create_task_group() as tasks:
            answers: list[int] = []

            async def ask() -> None:
                answers.append((await t.s.client.get("/")).status_code)

            tasks.start_soon(ask)
            await anyio.sleep(0.3)
            assert answers == []  # it waits: no lease on capacity nobody can reach
            t.client._token = NODE_SECRET  # the right token: streams open, it is reachable
            t.client._retry_at = 0
        assert answers == [200]


async def test_a_replica_holding_no_stream_of_the_node_relays_to_one_that_does(
    hello: Callable[[], int],
) -> None:
    """The balancer sent the request to replica r2, where the node holds no stream: r2 finds
    r1 in the node's coverage table and `ingresses/`, relays with its ingress token, and the
    answer comes back whole; the lease is r2's and goes back once."""
    async with tunnelled({"sb-1": hello()}) as t:
        await eventually(lambda: t.client.reachable)
        settings = t.s.ingress.settings.model_copy(
            update={
                "listen": "127.0.0.1:0",
                "admin_listen": "127.0.0.1:0",
                "tunnel_listen": "127.0.0.1:0",
                "tunnel_replica": "r2",
            }
        )
        registry = CollectorRegistry()
        other = Ingress(
            settings,
            InProcessLeases(t.s.activator),
            t.s.store,
            registry,
            relay_token=INGRESS_SECRET,
        )
        async with other.running():
            assert other.tunnels is not None
            await other.tunnels.synced.wait()
            await eventually(
                lambda: bool(other.tunnels and other.tunnels.peers.holding("n1", idle_only=True))
            )
            host, port = other.address
            async with httpx.AsyncClient(
                base_url=f"http://{host}:{port}", headers={"Host": "hello.localhost"}, timeout=30
            ) as client:
                body = b"relayed " * 100_000
                echoed = await client.post("/echo", content=body)
                assert echoed.status_code == 200
                assert echoed.content == body
                assert (await client.get("/")).text.startswith("hello from")
            relayed = registry.get_sample_value(
                "wakeful_ingress_tunnel_requests_total", {"path": "relayed"}
            )
            assert relayed == 2
            assert (
                t.s.registry.get_sample_value(
                    "wakeful_ingress_tunnel_requests_total", {"path": "relayed_in"}
                )
                == 2
            )
            # Its streams were carried on r1 and are idle there again.
            assert t.s.ingress.tunnels is not None
            await eventually(lambda: not any(s.busy for s in t.client.streams.values()))


async def test_a_relay_needs_an_ingress_token(hello: Callable[[], int]) -> None:
    async with tunnelled({"sb-1": hello()}) as t:
        await eventually(lambda: t.client.reachable)
        for secret, status in ((None, 401), (NODE_SECRET, 403)):
            headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
            headers[wire.NODE_HEADER] = "n1"
            with pytest.raises(websockets.InvalidStatus) as refused:
                await connect(f"ws://{t.tunnel}{wire.RELAY}", additional_headers=headers)
            assert refused.value.response.status_code == status
