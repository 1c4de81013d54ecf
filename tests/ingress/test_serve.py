"""`ingress.serve`, what `wakeful ingress` runs: it says it is ready only once it listens."""

from __future__ import annotations

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


async def test_ready_is_said_once_the_port_takes_connections() -> None:
    """`wakeful ingress` prints its line from `ready`: said before the listener was bound, a
    script (or a test) waiting for the line found nobody on the port (connection refused)."""
    port = free_port()
    settings = IngressSettings(
        store_url="memory://", listen=f"127.0.0.1:{port}", admin_listen="127.0.0.1:0"
    )
    seen: list[bool] = []
    async with open_store("memory://") as store, anyio.create_task_group() as tasks:

        def ready() -> None:
            seen.append(listening(port))
            tasks.cancel_scope.cancel()

        with anyio.fail_after(30):
            await serve(settings, FakeLeases({}), store, CollectorRegistry(), ready=ready)
    assert seen == [True]


def listening(port: int) -> bool:
    """A socket listens on `port` of IPv4 (the kernel's table: no connection to leave open)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
            return True
    return False
