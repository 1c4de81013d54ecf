"""WebSockets under `wakeful up`, with the shipped example (examples/ws-echo, stdlib only, in
its sandbox) and a real client: the first WebSocket wakes the app; while one is open, silent or
not, the app is never scaled to zero (the held lease is reported as traffic); once it closes,
the app goes to zero like any idle app."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.client import connect

from tests.support.up import Up, eventually_pool, no_sandbox_left, start_up, stop_up

pytestmark = pytest.mark.anyio
WS_ECHO = Path(__file__).resolve().parents[2] / "examples" / "ws-echo"
DELAY = 5.0
"""The app's scale_down_delay (the smallest allowed)."""


@pytest.fixture
def ws_up(tmp_path: Path) -> Iterator[Up]:
    app = tmp_path / "ws-echo"
    shutil.copytree(WS_ECHO, app)
    toml = (app / "wakeful.toml").read_text().replace('"60s"', f'"{DELAY:g}s"')
    (app / "wakeful.toml").write_text(toml)
    up = start_up(tmp_path, app)
    yield up
    stop_up(up)


async def test_an_open_websocket_keeps_its_app_up_and_its_close_lets_it_sleep(ws_up: Up) -> None:
    host, port = ws_up.proxy.removeprefix("http://").rsplit(":", 1)
    async with connect(f"ws://ws-echo.localhost:{port}/", host=host, port=int(port)) as ws:
        await ws.send("wake up")  # the app was at zero: this WebSocket woke it
        assert await ws.recv() == "wake up"
        # Silent for three scale-down delays: the idle monitor ticks every second meanwhile.
        await anyio.sleep(3 * DELAY)
        pool = await ws_up.pool("ws-echo")
        assert (pool["desired_instances"], pool["ready"]) == (1, 1), pool
        assert int(pool["leased"]) >= 1, pool  # type: ignore[call-overload]
        await ws.send(b"\x00still here")
        assert await ws.recv() == b"\x00still here"
    await eventually_pool(
        ws_up, lambda p: p["desired_instances"] == 0 and p["live"] == 0, 60, "ws-echo"
    )
    await no_sandbox_left(ws_up)
