"""How a connection to a sandbox ends (`upstream.closing`), on real loopback sockets: a sandbox
that reads everything sees a graceful end; one that stopped reading, with bytes still unsent in
the kernel though none are in asyncio's buffer, is reset, and keeps no kernel orphan."""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from wakeful.ingress.upstream.closing import shut, unsent_in_kernel

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def connected() -> AsyncIterator[tuple[asyncio.Transport, socket.socket]]:
    """An asyncio transport to a plain socket that reads nothing unless told to."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(asyncio.Protocol, *server.getsockname())
        peer, _ = server.accept()
        try:
            yield transport, peer
        finally:
            transport.abort()
            peer.close()


async def written_out(transport: asyncio.Transport) -> None:
    """Until asyncio's buffer is empty: what is left is the kernel's."""
    for _ in range(500):
        if not transport.get_write_buffer_size():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("asyncio's buffer never emptied")


async def test_a_sandbox_that_stopped_reading_is_reset_not_left_a_kernel_orphan() -> None:
    async with connected() as (transport, peer):
        transport.write(b"x" * 1_000_000)  # the kernel's send buffer takes it all
        await written_out(transport)
        assert unsent_in_kernel(transport) > 0  # held back by the sandbox's window
        shut(transport)
        poller = select.poll()
        poller.register(peer, select.POLLERR | select.POLLHUP | select.POLLRDHUP)
        # A FIN would wait behind the unsent bytes, and the sandbox would see nothing.
        events = await asyncio.to_thread(poller.poll, 5_000)
        assert events, "nothing reached the sandbox"
        assert events[0][1] & (select.POLLERR | select.POLLHUP), "not a reset"


async def test_a_sandbox_that_read_everything_gets_a_graceful_end() -> None:
    async with connected() as (transport, peer):
        transport.write(b"x" * 1000)
        await written_out(transport)
        assert unsent_in_kernel(transport) == 0
        shut(transport)
        peer.settimeout(5)

        def read_all() -> bytes:
            got = b""
            while chunk := peer.recv(65536):
                got += chunk
            return got

        assert await asyncio.to_thread(read_all) == b"x" * 1000  # all, then the end: no reset


async def test_what_is_unsent_cannot_be_known_without_a_socket() -> None:
    class NoSocket(asyncio.Transport):
        def get_extra_info(self, name: str, default: object = None) -> object:
            return default

    assert unsent_in_kernel(NoSocket()) == 0
