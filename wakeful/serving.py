"""Serving an ASGI app on a socket bound first, so a taken port is a clear error naming the
flag, and shutting it down gracefully: what `wakeful.bootstrap` runs the control API (and the
tests their apps) with."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Generator
from typing import Any

import anyio
import uvicorn

from wakeful.aio.loopback import hold_loopback_twin
from wakeful.domain.leases import CHANNEL_MAX_FRAME_BYTES


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the process's lifecycle decides shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def split_address(address: str, what: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise ValueError(f"{what}: expected host:port, got {address!r}")
    return host, int(port)


class AddressInUse(OSError):
    pass


def bind(address: str, what: str) -> socket.socket:
    """Bind before serving, so a taken port is a clear error naming the flag."""
    host, port = split_address(address, what)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise AddressInUse(f"{what} {address}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.setblocking(False)
    hold_loopback_twin(sock)  # no sandbox may answer on [::1] for us
    return sock


async def serve_asgi(app: Any, address: str, what: str, started: anyio.Event | None = None) -> None:
    """Serve until cancelled; then stop accepting and let open requests finish (10 s)."""
    sock = bind(address, what)
    server = EmbeddedServer(
        uvicorn.Config(
            app,
            # uvicorn's own handlers would print its errors (which can quote a request's
            # values) raw: its records go to the entry point's handler instead, which shows
            # control characters as escapes (`wakeful.cli.ShownFormatter`).
            log_config=None,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=10,
            # The lease channel is the only WebSocket served: its frames are small, and a
            # compressed one could inflate 16 MiB from 40 KB of wire (uvicorn's defaults).
            ws_max_size=CHANNEL_MAX_FRAME_BYTES,
            ws_per_message_deflate=False,
        )
    )
    done = anyio.Event()

    async def run() -> None:
        with anyio.CancelScope(shield=True):
            try:
                await server.serve(sockets=[sock])
            finally:
                done.set()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(run)
            try:
                while not server.started and not done.is_set():  # noqa: ASYNC110 - a flag, no event
                    await anyio.sleep(0.01)
                if started is not None:
                    started.set()
                await anyio.sleep_forever()
            finally:
                # Inside the task group: `run` is shielded and ends only once told to exit.
                # uvicorn then stops accepting and gives open requests
                # timeout_graceful_shutdown seconds to finish.
                server.should_exit = True
    finally:
        sock.close()
