"""`wakeful up`'s ingress workers (`wakeful.up.ingress_workers`) with fake workers: whatever
ends `wakeful up`'s block (a refused deploy, say), the workers drain and stop before their
token goes and before the rest of `wakeful up` stops. The real thing end to end:
tests/e2e/test_up_workers.py."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import anyio
import pytest

from wakeful.domain import keys
from wakeful.domain.models import UP_INGRESS_TOKEN, Token
from wakeful.store import open_store
from wakeful.store.reflector import reflect
from wakeful.store.testing import free_port
from wakeful.store.tokenbook import TokenBook
from wakeful.up import ingress_workers, up_settings

pytestmark = pytest.mark.anyio

FAKE_WORKER = r"""
import os, pathlib, signal, socket, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
mark = pathlib.Path(sys.argv[1], str(os.getpid()))
mark.write_text("running")
def term(*_):
    mark.write_text("drained")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
class Ready(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
class Server(HTTPServer):
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
host, port = os.environ["WAKEFUL_ADMIN_LISTEN"].rsplit(":", 1)
Server((host, int(port)), Ready).serve_forever()
"""


def _states(marks: Path) -> dict[int, str]:
    return {int(mark.name): mark.read_text() for mark in marks.iterdir()}


async def test_a_failure_in_ups_block_drains_the_workers_before_their_token_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("WAKEFUL_INGRESS_WORKERS", "2")
    up = up_settings(
        tmp_path,
        "admin-secret",
        api=f"127.0.0.1:{free_port()}",
        listen="127.0.0.1:0",
        admin=f"127.0.0.1:{free_port()}",
        isolation=None,
    )
    book = TokenBook()
    seen_at_the_stop: dict[int, str] = {}
    async with open_store("memory://") as store, anyio.create_task_group() as tasks:
        tasks.start_soon(partial(reflect, store, keys.TOKENS, Token, book, what="tokens"))
        held: list[Token | None] = []

        async def up_block_fails() -> None:
            command = [sys.executable, "-c", FAKE_WORKER, str(marks)]
            async with ingress_workers(up, "127.0.0.1:1", store, book, command):
                item = await store.get(keys.token(UP_INGRESS_TOKEN), Token)
                held.append(None if item is None else item.value)
                raise RuntimeError("deploy refused")

        refused = pytest.RaisesExc(RuntimeError, match="deploy refused")
        with pytest.RaisesGroup(refused, flatten_subgroups=True), anyio.fail_after(30):
            await up_block_fails()
        assert held and held[0] is not None  # the workers had their token while they ran
        seen_at_the_stop = await anyio.to_thread.run_sync(_states, marks)
        assert await store.get(keys.token(UP_INGRESS_TOKEN), Token) is None
        tasks.cancel_scope.cancel()
    assert len(seen_at_the_stop) == 2
    assert set(seen_at_the_stop.values()) == {"drained"}, seen_at_the_stop
