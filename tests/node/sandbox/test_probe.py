"""Readiness probing: the knock tells a closed port from an open one without a task or a
timer, and the full probe still decides (an HTTP app answering 503 is not ready)."""

from __future__ import annotations

import socket

import anyio
import anyio.lowlevel
import pytest

from wakeful.node.sandbox.probe import Knock, knock, probe, wait_ready
from wakeful.store.testing import free_port


def test_a_knock_tells_a_closed_port_from_an_open_one() -> None:
    port = free_port()
    assert knock("127.0.0.1", port) is Knock.REFUSED
    with socket.create_server(("127.0.0.1", port)):
        assert knock("127.0.0.1", port) is Knock.ACCEPTED
    assert knock("localhost", port) is Knock.UNKNOWN  # a name: no lookup on the loop


async def serve_status(port: int, status: int, task_status: anyio.abc.TaskStatus[None]) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                await stream.receive()
                await stream.send(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass  # a knock: connected and closed at once

    async with listener:
        task_status.started()
        await listener.serve(answer)


@pytest.mark.parametrize(("status", "ready"), [(200, True), (503, False)])
async def test_an_open_port_is_ready_only_when_its_health_path_says_so(
    status: int, ready: bool
) -> None:
    port = free_port()
    async with anyio.create_task_group() as tasks:
        await tasks.start(serve_status, port, status)
        assert await probe("127.0.0.1", port, "/healthz") is ready
        assert await probe("127.0.0.1", port, None) is True  # a TCP check: it listens
        tasks.cancel_scope.cancel()


async def test_a_port_that_opens_later_is_found_ready() -> None:
    port = free_port()

    async def never_exits() -> int:
        await anyio.sleep_forever()
        raise AssertionError

    async with anyio.create_task_group() as tasks:

        async def open_later() -> None:
            for _ in range(30):  # a few rounds of knocks see the port closed first
                await anyio.lowlevel.checkpoint()
            await tasks.start(serve_status, port, 200)

        tasks.start_soon(open_later)
        assert await wait_ready("127.0.0.1", port, "/healthz", 30, never_exits)
        tasks.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("status", "ready"),
    [("SERVING", True), ("NOT_SERVING", False), ("UNKNOWN", False)],
)
async def test_a_grpc_app_is_ready_when_its_health_service_says_serving(
    status: str, ready: bool
) -> None:
    """`[health] grpc = true`: the standard health check over h2c, against grpcio's own
    health service; an HTTP/1.1 app answering on the port is not a gRPC one."""
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    checks = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        checks.set("", health_pb2.HealthCheckResponse.ServingStatus.Value(status))
        assert await probe("127.0.0.1", port, None, grpc=True) is ready
    finally:
        server.stop(None)
    http = free_port()
    async with anyio.create_task_group() as tasks:
        await tasks.start(serve_status, http, 200)
        assert await probe("127.0.0.1", http, None, grpc=True) is False
        tasks.cancel_scope.cancel()
