"""`wakeful logs` against a real control API (the lines on stdout, a lag note on stderr), and
the HTTP sink a node on another machine pushes its output through."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client import CollectorRegistry

from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.bootstrap import serve_asgi
from wakeful.cli import main
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logs_api import logs_router
from wakeful.domain.logbatch import LogBatch, OutputChunk
from wakeful.domain.models import App, Role, Sandbox, SandboxStatus
from wakeful.node.logship import ShipFailed
from wakeful.remote import HttpLogSink
from wakeful.store import open_store
from wakeful.store.testing import free_port
from wakeful.store.tokenbook import TokenBook

pytestmark = pytest.mark.anyio
TOKEN = "cli-token"
ADMIN = TokenBook.of({TOKEN: Role.ADMIN})
"""The control API's credentials: TOKEN, as an admin token."""


async def test_logs_prints_the_lines_and_notes_a_node_gone_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WAKEFUL_TOKEN", TOKEN)
    clock = [1000.0]
    address = f"127.0.0.1:{free_port()}"
    async with open_store("memory://") as store:
        await store.put("apps/hello", App(name="hello"))
        await store.put(
            "sandboxes/sb-1",
            Sandbox(
                id="sb-1", pool="hello-v1", app="hello", node="n1", status=SandboxStatus.RUNNING
            ),
        )
        book = LogBook(clock=lambda: clock[0])
        text = "hello listening\n"
        chunk = OutputChunk(
            sandbox="sb-1", app="hello", created_at=1, offset=0, size=len(text), text=text
        )
        await book.ship(LogBatch(node="n1", interval=1, pending=0, dropped=0, chunks=[chunk]))
        clock[0] += 20
        registry = CollectorRegistry()
        activator = Activator(
            store, ActivatorSettings(store_url="memory://", token=TOKEN), registry
        )
        api = create_app(activator, ADMIN, registry, [logs_router(store, book)])

        def cli(*args: str) -> int:
            return main(["--api", f"http://{address}", "logs", *args])

        async with anyio.create_task_group() as tasks:
            started = anyio.Event()
            tasks.start_soon(serve_asgi, api, address, "--api-listen", started)
            await started.wait()
            assert await anyio.to_thread.run_sync(cli, "hello") == 0
            shown = capsys.readouterr()
            assert shown.out == "[sb-1] hello listening\n"
            assert shown.err == "wakeful: note: logs behind: n1: last batch 20 s ago\n"
            assert await anyio.to_thread.run_sync(cli, "nope") != 0
            assert "no app named 'nope'" in capsys.readouterr().err
            assert await anyio.to_thread.run_sync(cli, "hello", "--tail", "-5") != 0
            assert "tail" in capsys.readouterr().err
            tasks.cancel_scope.cancel()


async def test_the_http_sink_turns_a_refusal_or_an_unreachable_api_into_ship_failed() -> None:
    batch = LogBatch(node="n1", interval=1, pending=0, dropped=0)
    address = f"127.0.0.1:{free_port()}"
    async with HttpLogSink(f"http://{address}", TOKEN) as sink:
        with pytest.raises(ShipFailed, match="cannot reach"):
            await sink.ship(batch)
    async with open_store("memory://") as store:
        registry = CollectorRegistry()
        activator = Activator(
            store, ActivatorSettings(store_url="memory://", token=TOKEN), registry
        )
        book = LogBook()
        api = create_app(activator, ADMIN, registry, [logs_router(store, book)])
        async with anyio.create_task_group() as tasks:
            started = anyio.Event()
            tasks.start_soon(serve_asgi, api, address, "--api-listen", started)
            await started.wait()
            async with HttpLogSink(f"http://{address}", "wrong") as refused:
                with pytest.raises(ShipFailed, match="401"):
                    await refused.ship(batch)
            async with HttpLogSink(f"http://{address}", TOKEN) as sink:
                await sink.ship(batch)
            assert book.node("n1") is not None
            tasks.cancel_scope.cancel()
