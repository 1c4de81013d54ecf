"""`ingress.serve`, what `wakeful ingress` runs: it says it is ready only once it listens."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from wakeful.ingress import IngressSettings
from wakeful.ingress.server import serve
from wakeful.store.testing import free_port
from wakeful.store.url import open_store
from wakeful.testing import FakeLeases

pytestmark = pytest.mark.anyio


async def serve_on(
    port: int,
    wait_for_stop: Callable[[], Awaitable[int]],
    ready: Callable[[], None] = lambda: None,
    before: Callable[[], Awaitable[None]] | None = None,
    within: float = 30,
) -> None:
    """`serve` on a memory store and fake leases, its client listener on `port`."""
    settings = IngressSettings(
        store_url="memory://", listen=f"127.0.0.1:{port}", admin_listen="127.0.0.1:0"
    )
    async with open_store("memory://") as store:
        with anyio.fail_after(within):
            await serve(
                settings,
                FakeLeases({}),
                store,
                CollectorRegistry(),
                wait_for_stop=wait_for_stop,
                ready=ready,
                before=before,
            )


async def never() -> int:
    await anyio.sleep_forever()
    return 0


async def test_ready_is_said_once_the_port_takes_connections() -> None:
    """`wakeful ingress` prints its line from `ready`: said before the listener was bound, a
    script (or a test) waiting for the line found nobody on the port (connection refused)."""
    port = free_port()
    seen: list[bool] = []
    up = anyio.Event()

    def ready() -> None:
        seen.append(listening(port))
        up.set()

    async def stop_once_up() -> int:
        await up.wait()
        return signal.SIGINT

    await serve_on(port, stop_once_up, ready)
    assert seen == [True]


async def test_a_stop_before_it_listens_ends_the_start_at_once() -> None:
    """The start still waits (the token's check, here for ever): the stop ends it, nothing is
    announced, nothing listens."""
    port = free_port()
    said: list[str] = []
    stopping = anyio.Event()

    async def stop_when_waiting() -> int:
        await stopping.wait()
        return signal.SIGTERM

    async def checking() -> None:
        stopping.set()
        await anyio.sleep_forever()

    await serve_on(port, stop_when_waiting, lambda: said.append("ready"), checking, within=10)
    assert said == [] and not listening(port)


async def test_a_stop_once_it_listens_ends_it() -> None:
    port = free_port()
    up = anyio.Event()

    async def stop_once_up() -> int:
        await up.wait()
        return signal.SIGINT

    await serve_on(port, stop_once_up, up.set)
    assert up.is_set() and not listening(port)


async def test_a_start_that_fails_ends_serve_with_its_error() -> None:
    async def refused() -> None:
        raise RuntimeError("the token was refused")

    with pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        await serve_on(free_port(), never, before=refused, within=10)


def listening(port: int) -> bool:
    """A socket listens on `port` of IPv4 (the kernel's table: no connection to leave open)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
            return True
    return False
