"""Role-scoped credentials on the control API (invariant 17), over real HTTP to the whole
control plane: every route has an explicit decision in `wakeful.activator.roles`; a node
token and an ingress token do what their piece needs and get 403 on everything else; no
token or an unknown one is 401; a route nobody mapped is admin-only."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import websockets.asyncio.client
from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry
from websockets.exceptions import ConnectionClosed

from tests.support.activator import seed
from tests.support.control import Running, running_control_plane
from wakeful.activator.api import create_app, served_routes
from wakeful.activator.channel import MAX_CHANNELS_PER_TOKEN
from wakeful.activator.channel import PATH as CHANNEL_PATH
from wakeful.activator.client import ChannelLeases, HttpLeases
from wakeful.activator.core import Activator
from wakeful.activator.roles import PUBLIC, ROUTES, SESSION, WEBSOCKET
from wakeful.activator.settings import ActivatorSettings
from wakeful.aio.packing import pack
from wakeful.deploy.logs_api import own_output
from wakeful.domain import keys
from wakeful.domain.artifacts import digest_of
from wakeful.domain.leases import Unauthorized
from wakeful.domain.logbatch import LogBatch, OutputChunk, ShipFailed
from wakeful.domain.models import AppState, Node, Role, Sandbox, SandboxStatus
from wakeful.ingress import Ingress
from wakeful.ingress.settings import MAX_WORKERS, IngressSettings
from wakeful.remote import HttpArtifacts, HttpKeeper, HttpLogSink
from wakeful.store import open_store
from wakeful.store.testing import free_port
from wakeful.store.tokenbook import TokenBook

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"
EXAMPLE = {
    "lease_id": "l-1",
    "digest": "0" * 64,
    "app": "hello",
    "version": "v1",
    "node": "n1",
    "sandbox_id": "sb-1",
    "name": "n1",
    "key_id": "0123456789ab",
    "host": "registry.example.com",
    "tag": "beta",
}
"""A value for every path parameter of the control API."""
BOUND = 8
"""Lease channels per token in the tests of the bound."""


def routes_of(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) in `app.routes`, included routers opened."""
    return {(method, path) for method, path, _ in served_routes(app)}


SCHEMA = ("GET", "/openapi.json")
"""The API's schema: any role's token may read it, no token may not."""
WHOAMI = ("GET", "/v1/whoami")
"""Any role: a piece apart asks it at its start (`wakeful.startcheck`)."""
NODE_MAY = {
    ("GET", "/v1/artifacts/{digest}"),
    ("GET", "/v1/blobs/{digest}"),
    ("PUT", "/v1/states/{app}/archives/{digest}"),
    ("POST", "/v1/states/{app}/release"),
    ("POST", "/v1/states/{app}/keep"),
    ("POST", "/v1/logs"),
    ("GET", "/v1/sandboxes/{sandbox_id}/secrets"),
    SCHEMA,
    WHOAMI,
}
"""What `wakeful node` calls (`HttpArtifacts`, `HttpBlobs`, `HttpKeeper`, `HttpLogSink`,
`HttpSecrets`),
written out here
rather than read from the map, so a map that grants more fails these tests."""
INGRESS_MAY = {
    ("POST", "/v1/leases"),
    (WEBSOCKET, "/v1/leases/channel"),
    ("POST", "/v1/leases/{lease_id}/renew"),
    ("DELETE", "/v1/leases/{lease_id}"),
    ("GET", "/v1/certs/served"),
    SCHEMA,
    WHOAMI,
}
"""What `wakeful ingress` calls (`HttpLeases`, and `HttpCerts` for certificates from ACME)."""


def refused(app: FastAPI, may: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every route `app` serves that needs a token, except `may`."""
    return sorted(
        (method, path)
        for method, path in routes_of(app)
        if ROUTES.get((method, path)) not in (PUBLIC, SESSION) and (method, path) not in may
    )


@dataclass
class Control:
    running: Running
    http: httpx.AsyncClient
    """No token of its own: each call names the one it sends."""
    node: str
    ingress: str

    async def call(self, method: str, path: str, token: str | None) -> httpx.Response:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        if method == WEBSOCKET:  # a handshake: refused with an HTTP answer, or a 101
            method = "GET"
            headers |= {
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            }
        return await self.http.request(method, path.format(**EXAMPLE), headers=headers)


@contextlib.asynccontextmanager
async def controlled(tmp_path: Path, **settings: Any) -> AsyncIterator[Control]:
    """A control plane with a node and an ingress token; `settings`: ActivatorSettings
    fields."""
    async with (
        running_control_plane(tmp_path, **settings) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        secrets = {}
        for role in ("node", "ingress"):
            made = await http.post(
                "/v1/tokens",
                json={"name": "n1" if role == "node" else "edge", "role": role},
                headers={"Authorization": f"Bearer {running.token}"},
            )
            assert made.status_code == 201, made.text
            secrets[role] = made.json()["secret"]
        yield Control(running, http, secrets["node"], secrets["ingress"])


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[Control]:
    async with controlled(tmp_path) as running:
        yield running


@pytest.fixture
async def bounded(tmp_path: Path) -> AsyncIterator[Control]:
    """At most `BOUND` lease channels a token."""
    async with controlled(tmp_path, max_channels_per_token=BOUND) as running:
        yield running


async def test_every_route_of_the_control_api_has_an_explicit_role_decision(
    control: Control,
) -> None:
    """A route added without a decision in wakeful/activator/roles.py fails here (it would be
    admin-only meanwhile); a decision for a route that is gone fails too."""
    served = routes_of(control.running.plane.api)
    assert served - ROUTES.keys() == set(), "no role decision in activator/roles.py"
    assert ROUTES.keys() - served == set(), "a decision for a route that does not exist"


async def test_a_route_nobody_mapped_is_admin_only() -> None:
    extra = APIRouter()

    @extra.get("/v1/unmapped")
    async def unmapped() -> dict[str, str]:
        return {"ok": "yes"}

    tokens = {"a": Role.ADMIN, "n": Role.NODE, "i": Role.INGRESS}
    async with open_store("memory://") as store:
        registry = CollectorRegistry()
        activator = Activator(store, ActivatorSettings(store_url="memory://"), registry)
        app = create_app(activator, TokenBook.of(tokens), registry, [extra])
        assert ("GET", "/v1/unmapped") in routes_of(app) - ROUTES.keys()  # the test above fails
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:

            async def get(token: str | None) -> httpx.Response:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                return await http.get("/v1/unmapped", headers=headers)

            assert (await get("a")).status_code == 200
            for token, role in (("n", "node"), ("i", "ingress")):
                refused = await get(token)
                assert refused.status_code == 403
                assert refused.json() == {
                    "error": "forbidden",
                    "detail": f"GET /v1/unmapped needs the admin role; this token has the "
                    f"{role} role",
                }
            assert (await get(None)).status_code == 401


async def test_a_node_token_fetches_artifacts_and_pushes_logs_and_nothing_else(
    control: Control,
) -> None:
    data = pack(HELLO)
    digest = await control.running.plane.artifacts.put(data)
    # The very clients `wakeful node` uses, with the node's token.
    async with HttpArtifacts(control.running.url, control.node) as artifacts:
        assert await artifacts.fetch(digest) == data
    # A stateful app's state that n1 holds: its archive stored, the state released with it.
    await control.running.store.put(
        keys.state("notes"), AppState(app="notes", node="n1", epoch=3, sandbox="s1")
    )
    async with HttpKeeper(control.running.url, control.node, "n1") as keeper:
        state = pack(HELLO, skip=frozenset({"nothing"}))
        await keeper.store("notes", 3, state, digest_of(state))
        released = await keeper.release("notes", 3, archive=digest_of(state), size=len(state))
        assert isinstance(released, AppState) and released.archive == digest_of(state)
    async with HttpLogSink(control.running.url, control.node) as logs:
        await logs.ship(LogBatch(node="n1", interval=1, pending=0, dropped=0))
    # ... and not the ones the ingress uses.
    async with HttpLeases(control.running.url, control.node) as leases:
        with pytest.raises(Unauthorized, match="needs the ingress or admin role"):
            await leases.acquire("hello")
    forbidden = refused(control.running.plane.api, NODE_MAY)
    for named in [
        ("POST", "/v1/deploys"),
        ("POST", "/v1/nodes/{node}/drain"),
        ("POST", "/v1/tokens"),
        ("POST", "/v1/tokens/{name}/rotate"),
        ("GET", "/v1/apps/{app}/logs"),
    ]:
        assert named in forbidden
    for method, path in forbidden:
        answer = await control.call(method, path, control.node)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["error"] == "forbidden"
        assert f"{method} {path} needs the " in answer.json()["detail"]
        assert answer.json()["detail"].endswith("role; this token has the node role")


async def test_a_piece_asks_who_its_token_is_at_its_start(control: Control) -> None:
    """`wakeful node` and `wakeful ingress` ask once before they take sandboxes or requests
    (`wakeful.startcheck`): with a wrong token a node said `node n2 running`, was placed
    sandboxes, and each failed as if its app had crashed (the second walkthrough). Any role's
    token is told its name and role; a wrong one is refused; an unreachable API says nothing."""
    for token, who in (
        (control.node, ("n1", "node")),
        (control.ingress, ("edge", "ingress")),
        (control.running.token, ("admin", "admin")),
    ):
        async with HttpArtifacts(control.running.url, token) as artifacts:
            assert await artifacts.whoami() == who
    async with HttpArtifacts(control.running.url, "wrongtoken") as artifacts:
        said = await artifacts.whoami()
        assert isinstance(said, str) and said.startswith("the control API refused its token (401)")
    async with HttpArtifacts(f"http://127.0.0.1:{free_port()}", control.node) as artifacts:
        assert await artifacts.whoami() is None


async def test_an_ingress_whose_token_is_refused_is_not_ready(control: Control) -> None:
    """It said `ingress listening`, and its /readyz answered 200 while every request got 503
    (the second walkthrough): a balancer kept it in rotation. Refused, it is not ready; with
    a token the activator takes, it is."""
    for token, ready in (("wrongtoken", False), (control.ingress, True)):
        settings = IngressSettings(
            store_url="memory://", listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
        )
        async with ChannelLeases(control.running.url, token) as leases:
            ingress = Ingress(settings, leases, control.running.store, CollectorRegistry())
            async with ingress.running():
                with anyio.fail_after(10):
                    while ingress.ready is not ready or (not ready and leases.refused is None):  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                assert leases.refused == (
                    None if ready else "the activator refused the token (401)"
                )


async def test_an_ingress_token_takes_renews_and_releases_leases_and_nothing_else(
    control: Control,
) -> None:
    store = control.running.store
    await store.put(keys.node("n1"), Node(name="n1", address="127.0.0.1"))
    await seed(store, sandboxes={"sb-1": SandboxStatus.RUNNING})
    async with HttpLeases(control.running.url, control.ingress) as leases:
        grant = await leases.acquire("hello")
        assert grant.sandbox_id == "sb-1"
        assert (await leases.renew(grant.lease_id, used=True)).lease_id == grant.lease_id
        await leases.release(grant.lease_id)
    assert control.running.plane.activator.leased_on("sb-1") == 0
    forbidden = refused(control.running.plane.api, INGRESS_MAY)
    assert ("GET", "/v1/artifacts/{digest}") in forbidden and ("POST", "/v1/logs") in forbidden
    for method, path in forbidden:
        answer = await control.call(method, path, control.ingress)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.json()["detail"].endswith("role; this token has the ingress role")


async def test_no_token_or_an_unknown_one_is_401_and_public_routes_need_none(
    control: Control,
) -> None:
    for (method, path), allowed in ROUTES.items():
        if allowed == PUBLIC:
            if method == "GET":
                assert (await control.call(method, path, None)).status_code == 200, path
            continue
        if allowed == SESSION:  # the dashboard: no bearer token opens it, nor needs to
            for token in (None, control.node):
                answer = await control.call(method, path, token)
                if path in ("/ui/session", "/ui/events"):
                    assert answer.status_code == 401, (method, path, token)
                # No session is ever issued (logging out clears one: an empty value).
                assert not re.search(
                    r"wakeful_session=[^\";]", answer.headers.get("set-cookie", "")
                )
            continue
        for token in (None, "not-a-token", control.node + "x"):
            answer = await control.call(method, path, token)
            assert answer.status_code == 401, (method, path, token, answer.text)
            assert answer.json()["error"] == "unauthorized"
            assert answer.headers["WWW-Authenticate"] == "Bearer"


async def test_without_a_token_no_body_is_read_or_parsed() -> None:
    """FastAPI parses a body before it runs dependencies: without the gate, a malformed body
    with no token got a 422 naming the parse error, and megabytes were buffered first."""
    read: list[int] = []
    async with open_store("memory://") as store:
        registry = CollectorRegistry()
        activator = Activator(store, ActivatorSettings(store_url="memory://"), registry)
        app = create_app(activator, TokenBook.of({"a": Role.ADMIN}), registry)

        async def body() -> AsyncIterator[bytes]:
            for _ in range(64):  # 64 MiB offered; counted as it is read
                read.append(1)
                yield b"{" * (1 << 20)

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
            answer = await http.post(
                "/v1/leases", content=body(), headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 401
            assert answer.json()["error"] == "unauthorized"
            assert len(read) <= 1  # the gate answered before reading the body
            bad = await http.post("/v1/leases", content=b"{", headers={"Authorization": "Bearer a"})
            assert bad.status_code == 422  # with a token, the body is parsed as before


async def test_a_mounted_app_is_refused_when_the_api_is_built() -> None:
    """A mount never sees the role dependency: building an API with one fails loudly."""
    extra = APIRouter()
    extra.mount("/v1/files", FastAPI())
    async with open_store("memory://") as store:
        registry = CollectorRegistry()
        activator = Activator(store, ActivatorSettings(store_url="memory://"), registry)
        with pytest.raises(RuntimeError, match="a mount would be served without the role"):
            create_app(activator, TokenBook.of({"a": Role.ADMIN}), registry, [extra])


async def test_a_node_token_pushes_only_its_own_nodes_output(control: Control) -> None:
    """Named after its node, a node token cannot push another node's batch (403)."""
    async with HttpLogSink(control.running.url, control.node) as logs:
        with pytest.raises(ShipFailed, match="cannot push node 'n2'"):
            await logs.ship(LogBatch(node="n2", interval=1, pending=0, dropped=0))


async def test_a_nodes_batch_keeps_only_output_of_sandboxes_recorded_on_it() -> None:
    """Output for a sandbox recorded elsewhere, under another app, or nowhere is dropped: a
    node cannot forge, mislabel or evict another node's logs."""
    async with open_store("memory://") as store:
        for sandbox_id, node in (("mine-1", "n1"), ("theirs-1", "n2")):
            record = Sandbox(id=sandbox_id, pool="hello-v1", app="hello", node=node, owner=node)
            await store.put(keys.sandbox(sandbox_id), record)

        def chunk(sandbox_id: str, app: str) -> OutputChunk:
            return OutputChunk(
                sandbox=sandbox_id, app=app, created_at=1, offset=0, size=2, text="x\n"
            )

        batch = LogBatch(
            node="n1",
            interval=1,
            pending=0,
            dropped=0,
            chunks=[
                chunk("mine-1", "hello"),
                chunk("theirs-1", "hello"),
                chunk("mine-1", "other"),
                chunk("made-up-1", "hello"),
            ],
        )
        kept = await own_output(store, batch, "n1")
    assert [(c.sandbox, c.app) for c in kept.chunks] == [("mine-1", "hello")]


async def test_the_schema_is_served_to_any_role_and_to_no_one_without_a_token(
    control: Control,
) -> None:
    """FastAPI's own schema route sits outside the app's dependency: served as ours, it is
    checked like every other route."""
    assert (await control.call(*SCHEMA, None)).status_code == 401
    for token in (control.node, control.ingress):
        answer = await control.call(*SCHEMA, token)
        assert answer.status_code == 200
        assert "/v1/leases" in answer.json()["paths"]


async def test_a_revoked_ingress_token_closes_its_open_lease_channel(control: Control) -> None:
    """Checked at every frame, not only at the handshake: the channel an ingress opened keeps
    no power its token lost."""
    store = control.running.store
    await store.put(keys.node("n1"), Node(name="n1", address="127.0.0.1"))
    await seed(store, sandboxes={"sb-1": SandboxStatus.RUNNING})
    async with ChannelLeases(control.running.url, control.ingress) as leases:
        grant = await leases.acquire("hello")
        await leases.release(grant.lease_id)
        revoked = await control.call("DELETE", "/v1/tokens/edge", control.running.token)
        assert revoked.status_code in (200, 204), revoked.text
        # The channel closes under the call (1008); the acquire is made again on a new
        # channel (as after a failover), which the token cannot open any more.
        with pytest.raises(Unauthorized):
            await leases.acquire("hello")
        assert leases._link is None or not leases._link.alive
        with pytest.raises(Unauthorized):
            await leases.acquire("hello")


def _channel(control: Control, token: str) -> websockets.asyncio.client.connect:
    url = control.running.url.replace("http", "ws", 1) + CHANNEL_PATH
    return websockets.asyncio.client.connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}
    )


async def test_an_ingress_refused_a_channel_tries_again_a_second_later_not_at_once(
    bounded: Control, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the bound a channel is accepted, then closed with 1013: the client takes that
    for a failed attempt. An idle ingress that keeps its channel for its routes would else
    open one, be refused, and open the next at once, hundreds of times a second."""
    control = bounded
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(BOUND):
            await stack.enter_async_context(_channel(control, control.ingress))
        async with ChannelLeases(control.running.url, control.ingress) as leases:
            leases.routes("edge-1", 1)
            await anyio.sleep(1.5)
        refusals = [r for r in caplog.records if "lease channels open" in r.getMessage()]
        assert 1 <= len(refusals) <= 3, len(refusals)


async def test_a_revoked_token_closes_its_channel_even_while_the_ingress_sends_nothing(
    control: Control,
) -> None:
    """Checked between frames too: an ingress that keeps a channel open and idle does not
    keep a power its token lost."""
    async with _channel(control, control.ingress) as idle:
        revoked = await control.call("DELETE", "/v1/tokens/edge", control.running.token)
        assert revoked.status_code in (200, 204), revoked.text
        with anyio.fail_after(30), pytest.raises(ConnectionClosed) as closed:
            await idle.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_one_token_opens_a_bounded_number_of_lease_channels(bounded: Control) -> None:
    """Each ingress process keeps one channel open, and ingresses (a worker is one) may
    share a token; a token opening channels without end (each may park thousands of
    acquires) is refused past the bound (`WAKEFUL_MAX_CHANNELS_PER_TOKEN`), with 1013. By
    default the bound is over the most workers one `wakeful ingress` runs, four times."""
    control = bounded
    assert MAX_CHANNELS_PER_TOKEN >= 4 * MAX_WORKERS
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(BOUND):
            await stack.enter_async_context(_channel(control, control.ingress))
        async with _channel(control, control.ingress) as extra:
            with anyio.fail_after(30), pytest.raises(ConnectionClosed) as closed:
                await extra.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        async with _channel(control, control.running.token) as other:  # other tokens: theirs
            await other.send(json.dumps([{"id": 1, "op": "release", "lease": "none"}]))
            with anyio.fail_after(30):
                assert json.loads(await other.recv())[0]["id"] == 1
    async with _channel(control, control.ingress) as again:  # the bound counts open ones
        await again.send(json.dumps([{"id": 1, "op": "release", "lease": "none"}]))
        with anyio.fail_after(30):
            assert json.loads(await again.recv())[0]["id"] == 1
