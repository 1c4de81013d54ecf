"""The ingress sets no socket option of its own for Nagle's delay: both event loops it runs on
turn TCP_NODELAY on for every TCP transport they make, accepted on the ingress's own
listeners (`bind_listener`: asyncio's loop only on a listener made as TCP, proto
IPPROTO_TCP) and connected to an address. The ingress's client connections and its
connections to sandboxes rely on that (an explicit `setsockopt` per connection cost two
system calls and a socket object made and detached in Python: some 4 µs of the 49 a request
on a new connection took, docs/design/data-plane.md)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop

from wakeful.ingress.ports import bind_listener

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


class _Kept(asyncio.Protocol):
    def __init__(self, made: list[asyncio.BaseTransport]) -> None:
        self._made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made.append(transport)


def _nodelay(transport: asyncio.BaseTransport) -> int:
    sock = transport.get_extra_info("socket")
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def _both_ends() -> tuple[int, int]:
    loop = asyncio.get_running_loop()
    accepted: list[asyncio.BaseTransport] = []
    listener = bind_listener("127.0.0.1:0", 16, "test address")
    server = await loop.create_server(lambda: _Kept(accepted), sock=listener)
    port = server.sockets[0].getsockname()[1]
    connected, _ = await loop.create_connection(lambda: _Kept([]), "127.0.0.1", port)
    for _ in range(200):
        if accepted:
            break
        await asyncio.sleep(0.005)
    try:
        return _nodelay(accepted[0]), _nodelay(connected)
    finally:
        connected.close()
        accepted[0].close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_the_loop_sets_nodelay_on_accepted_and_connected_tcp_transports(name: str) -> None:
    loop = LOOPS[name]()
    try:
        assert loop.run_until_complete(_both_ends()) == (1, 1)
    finally:
        loop.close()
