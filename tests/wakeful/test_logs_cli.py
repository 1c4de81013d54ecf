"""`wakeful logs` against a real control API (the lines on stdout, an app's control
characters shown as escapes, the exact text with `--json`, a lag note on stderr), and the HTTP
sink a node on another machine pushes its output through."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.support.control import running_control_plane
from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.cli import main
from wakeful.deploy.logbook import LogBook
from wakeful.deploy.logdir import LogDir
from wakeful.deploy.logs_api import logs_router
from wakeful.domain.logbatch import LogBatch, OutputChunk, ShipFailed
from wakeful.domain.logfiles import Limits
from wakeful.domain.models import App, Role, Sandbox, SandboxStatus
from wakeful.remote import HttpLogSink
from wakeful.serving import serve_asgi
from wakeful.store import open_store
from wakeful.store.testing import free_port
from wakeful.store.tokenbook import TokenBook

pytestmark = pytest.mark.anyio
TOKEN = "cli-token"
ADMIN = TokenBook.of({TOKEN: Role.ADMIN})
"""The control API's credentials: TOKEN, as an admin token."""
LIMITS = Limits(retention=86400, max_bytes=1 << 30, app_max_bytes=1 << 28)


async def test_logs_prints_the_lines_and_notes_a_node_gone_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
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
        logdir = LogDir(tmp_path, "t1", LIMITS, sync=False, clock=lambda: clock[0])
        logdir.start()
        book = LogBook(logdir, clock=lambda: clock[0])
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
            assert shown.out == "1970-01-01T00:16:40.000Z [sb-1] hello listening\n"
            assert shown.err == "wakeful: note: logs behind: n1: last batch 20 s ago\n"
            assert await anyio.to_thread.run_sync(cli, "nope") != 0
            assert "no app named 'nope'" in capsys.readouterr().err
            assert await anyio.to_thread.run_sync(cli, "hello", "--tail", "-5") != 0
            assert "--tail: from 1 to 10000 (got -5)" in capsys.readouterr().err
            assert await anyio.to_thread.run_sync(cli, "hello", "--since", "soon") != 0
            assert "--since: 'soon': not a time" in capsys.readouterr().err
            inverted = ("hello", "--since", "1h", "--until", "2h")  # it printed nothing, exit 0
            assert await anyio.to_thread.run_sync(cli, *inverted) != 0
            assert capsys.readouterr().err == (
                "wakeful: error: --until 2h is before --since 1h: no line could be in it\n"
            )
            tasks.cancel_scope.cancel()
        logdir.stop()


async def test_the_http_sink_turns_a_refusal_or_an_unreachable_api_into_ship_failed(
    tmp_path: Path,
) -> None:
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
        book = LogBook(LogDir(tmp_path, "t1", LIMITS))  # an empty batch writes nothing
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


HOSTILE = (
    "copied \x1b]52;c;ZWNobyBwd25lZA==\x07 to your clipboard\n"
    "\x1b]0;wakeful: all good\x07\x1b[2K\r[sb-9] wakeful: deployed\n"
    "\x9b31mred\tand tabbed\n"
)
"""An app's output that, sent raw to a terminal, writes the clipboard, sets the window title,
erases its own `[sb-1]` prefix for a forged one, and starts a C1 CSI sequence."""


async def test_logs_show_an_apps_control_characters_and_json_keeps_them_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_control_plane(tmp_path) as control:
        monkeypatch.setenv("WAKEFUL_TOKEN", control.token)
        await control.store.put("apps/hello", App(name="hello"))
        chunk = OutputChunk(
            sandbox="sb-1",
            app="hello",
            created_at=1,
            offset=0,
            size=len(HOSTILE.encode()),
            text=HOSTILE,
        )
        await control.plane.logbook.ship(
            LogBatch(node="n1", interval=1, pending=0, dropped=0, chunks=[chunk])
        )

        def cli(*args: str) -> int:
            return main(["--api", control.url, "logs", "hello", *args])

        assert await anyio.to_thread.run_sync(cli) == 0
        out = capsys.readouterr().out
        assert not [c for c in out if c not in "\t\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)]
        assert [line.split(" ", 1)[1] for line in out.splitlines()] == [
            "[sb-1] copied \\x1b]52;c;ZWNobyBwd25lZA==\\x07 to your clipboard",
            "[sb-1] \\x1b]0;wakeful: all good\\x07\\x1b[2K\\r[sb-9] wakeful: deployed",
            "[sb-1] \\x9b31mred\tand tabbed",
        ]
        assert await anyio.to_thread.run_sync(cli, "--json") == 0
        out = capsys.readouterr().out
        assert out.isascii()
        records = [json.loads(line) for line in out.splitlines()]
        assert [{k: r[k] for k in ("sandbox", "line")} for r in records] == [
            {"sandbox": "sb-1", "line": line} for line in HOSTILE.removesuffix("\n").split("\n")
        ]
