"""Sandbox output through the control API: nodes push batches, readers get lines and notes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logdir import LogDir
from wakeful.deploy.logs_api import BEHIND_HEADER, MAX_READS, logs_router
from wakeful.domain.logbatch import MAX_BODY_BYTES, LogBatch, OutputChunk
from wakeful.domain.logfiles import Limits
from wakeful.domain.models import App, Role, Sandbox, SandboxStatus
from wakeful.store import Store, open_store
from wakeful.store.tokenbook import TokenBook

pytestmark = pytest.mark.anyio
TOKEN = "logs-token"
ADMIN = TokenBook.of({TOKEN: Role.ADMIN})
"""The control API's credentials: TOKEN, as an admin token."""
LIMITS = Limits(retention=86400, max_bytes=1 << 30, app_max_bytes=1 << 28)


@dataclass
class Control:
    client: httpx.AsyncClient
    store: Store
    clock: list[float]

    async def push(self, node: str, *chunks: OutputChunk, pending: int = 0) -> httpx.Response:
        batch = LogBatch(node=node, interval=1, pending=pending, dropped=0, chunks=list(chunks))
        return await self.client.post(
            "/v1/logs",
            content=batch.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[Control]:
    clock = [1000.0]
    logdir = LogDir(tmp_path, "t1", LIMITS, sync=False, clock=lambda: clock[0])
    logdir.start()
    async with open_store("memory://") as store:
        registry = CollectorRegistry()
        activator = Activator(
            store, ActivatorSettings(store_url="memory://", token=TOKEN), registry
        )
        book = LogBook(logdir, clock=lambda: clock[0])
        api = create_app(activator, ADMIN, registry, [logs_router(store, book)])
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api),
            base_url="http://control",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as client:
            yield Control(client, store, clock)
    logdir.stop()


def chunk(sandbox: str, text: str, created_at: float, offset: int = 0) -> OutputChunk:
    return OutputChunk(
        sandbox=sandbox,
        app="hello",
        created_at=created_at,
        offset=offset,
        size=len(text.encode()),
        text=text,
    )


async def add_sandbox(store: Store, sandbox_id: str, node: str, created_at: float) -> None:
    await store.put(
        f"sandboxes/{sandbox_id}",
        Sandbox(
            id=sandbox_id,
            pool="hello-v1",
            app="hello",
            node=node,
            owner=node,
            epoch=1,
            status=SandboxStatus.RUNNING,
            created_at=created_at,
        ),
    )


async def test_pushed_output_reads_back_in_the_order_it_came_filtered(control: Control) -> None:
    await control.store.put("apps/hello", App(name="hello"))
    await add_sandbox(control.store, "sb-new", "n1", created_at=20)
    await add_sandbox(control.store, "sb-old", "n2", created_at=10)
    assert (await control.push("n1", chunk("sb-new", "b1\nb2\n", 20))).status_code == 204
    control.clock[0] += 5
    assert (await control.push("n2", chunk("sb-old", "a1\na2\n", 10))).status_code == 204

    async def read(**params: object) -> str:
        answer = await control.client.get("/v1/apps/hello/logs", params=params)
        assert answer.status_code == 200, answer.text
        return answer.text

    assert await read() == "[sb-new] b1\n[sb-new] b2\n[sb-old] a1\n[sb-old] a2\n"
    assert await read(tail=1) == "[sb-old] a2\n"
    assert await read(sandbox="sb-new") == "[sb-new] b1\n[sb-new] b2\n"
    assert await read(grep="2") == "[sb-new] b2\n[sb-old] a2\n"
    assert await read(since="1003") == "[sb-old] a1\n[sb-old] a2\n"  # streamed from then on
    assert await read(since="1003", until="1004") == ""
    assert await read(since="2s") == "[sb-old] a1\n[sb-old] a2\n"  # back from the clock
    lines = (await read(format="json", tail=2)).splitlines()
    record = json.loads(lines[0])
    assert {k: record[k] for k in ("app", "sandbox", "node", "line")} == {
        "app": "hello",
        "sandbox": "sb-old",
        "node": "n2",
        "line": "a1",
    }
    one = await control.client.get("/v1/sandboxes/sb-old/log")
    assert (one.status_code, one.text) == (200, "a1\na2\n")


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"since": "yesterday"}, "since: 'yesterday': not a time"),
        ({"until": "5 minutes"}, "until: '5 minutes': not a time"),
        ({"sandbox": "../x"}, "sandbox: not a sandbox id"),
        ({"version": "V1"}, "version: not a version"),
        ({"kind": "errors"}, "kind"),
        ({"grep": ""}, "grep"),
    ],
)
async def test_a_bad_query_is_refused_naming_it(
    control: Control, params: dict[str, str], named: str
) -> None:
    await control.store.put("apps/hello", App(name="hello"))
    answer = await control.client.get("/v1/apps/hello/logs", params=params)
    assert answer.status_code == 422
    assert named in answer.text


async def test_the_answer_says_which_node_is_behind(control: Control) -> None:
    await control.store.put("apps/hello", App(name="hello"))
    await add_sandbox(control.store, "sb-1", "n1", created_at=1)
    await add_sandbox(control.store, "sb-2", "n2", created_at=2)
    await control.push("n1", chunk("sb-1", "one\n", 1))
    await control.push("n2", chunk("sb-2", "two\n", 2), pending=512)
    control.clock[0] += 14
    await control.push("n2")  # n2 is still shipping, n1 has gone quiet
    answer = await control.client.get("/v1/apps/hello/logs")
    assert answer.text == "[sb-1] one\n[sb-2] two\n"
    assert answer.headers[BEHIND_HEADER] == "n1: last batch 14 s ago"


@pytest.mark.parametrize("tail", ["-5", "0", "10001", "many"])
async def test_a_bad_tail_is_refused_naming_it(control: Control, tail: str) -> None:
    await control.store.put("apps/hello", App(name="hello"))
    for path in ["/v1/apps/hello/logs", "/v1/sandboxes/sb-1/log"]:
        answer = await control.client.get(path, params={"tail": tail})
        assert answer.status_code == 422
        assert answer.json()["error"] == "invalid request"
        assert "tail" in answer.json()["detail"] and repr(tail) in answer.json()["detail"]


async def test_an_unknown_app_or_sandbox_is_a_404_and_a_malformed_name_a_422(
    control: Control,
) -> None:
    unknown = await control.client.get("/v1/apps/nope/logs")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "unknown app", "detail": "no app named 'nope'"}
    malformed = await control.client.get("/v1/apps/Not_An_App/logs")
    assert malformed.status_code == 422
    assert "app" in malformed.json()["detail"] and "'Not_An_App'" in malformed.json()["detail"]
    no_sandbox = await control.client.get("/v1/sandboxes/sb-9/log")
    assert no_sandbox.status_code == 404
    assert "sb-9" in no_sandbox.json()["detail"]
    bad_id = await control.client.get("/v1/sandboxes/SB_1/log")
    assert bad_id.status_code == 422
    assert "'SB_1'" in bad_id.json()["detail"]
    await add_sandbox(control.store, "sb-quiet", "n1", created_at=1)
    quiet = await control.client.get("/v1/sandboxes/sb-quiet/log")
    assert (quiet.status_code, quiet.text) == (200, "")  # known, wrote nothing yet


async def oversized() -> AsyncIterator[bytes]:
    for _ in range(MAX_BODY_BYTES // 65536 + 1):
        yield b" " * 65536


async def test_a_batch_is_refused_when_too_large_malformed_or_unauthorized(
    control: Control,
) -> None:
    declared = await control.client.post("/v1/logs", content=b"x" * (MAX_BODY_BYTES + 1))
    assert declared.status_code == 413
    assert declared.json()["error"] == "batch too large"
    streamed = await control.client.post("/v1/logs", content=oversized())  # no length given
    assert streamed.status_code == 413
    garbage = await control.client.post("/v1/logs", content=b"{not json")
    assert garbage.status_code == 422
    assert garbage.json()["error"] == "invalid request"
    negative = await control.client.post(
        "/v1/logs",
        json={
            "node": "n1",
            "interval": 1,
            "pending": 0,
            "dropped": 0,
            "chunks": [
                {
                    "sandbox": "sb-1",
                    "app": "hello",
                    "created_at": 0,
                    "offset": -1,
                    "size": 0,
                    "text": "",
                }
            ],
        },
    )
    assert negative.status_code == 422
    assert "chunks.0.offset" in negative.json()["detail"]
    stranger = await control.client.post(
        "/v1/logs", content=b"{}", headers={"Authorization": "Bearer wrong"}
    )
    assert stranger.status_code == 401


async def test_clients_that_leave_before_their_answer_give_their_read_back(
    control: Control,
) -> None:
    """A streamed read holds one of `MAX_READS` slots; a client that hangs up before the
    body starts (Ctrl-C, its own timeout) must give it back, or reads end up refused."""
    await control.store.put("apps/hello", App(name="hello"))
    await add_sandbox(control.store, "sb-1", "n1", created_at=1)
    await control.push("n1", chunk("sb-1", "one\n", 1))
    api = control.client._transport.app  # type: ignore[attr-defined]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/apps/hello/logs",
        "raw_path": b"/v1/apps/hello/logs",
        "query_string": b"since=0",
        "root_path": "",
        "headers": [(b"host", b"control"), (b"authorization", f"Bearer {TOKEN}".encode())],
        "server": ("control", 80),
        "client": ("127.0.0.1", 1),
    }
    for _ in range(MAX_READS + 2):
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive(messages: list[dict[str, object]] = messages) -> dict[str, object]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            pass

        await api(scope, receive, send)
    answer = await control.client.get("/v1/apps/hello/logs", params={"since": "0"})
    assert (answer.status_code, answer.text) == (200, "[sb-1] one\n")
