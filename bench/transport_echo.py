"""The measurement behind the tunnels' transport (docs/design/tunnels.md): a 200-byte message
there and back over one grpc.aio bidirectional stream and over one WebSocket (the
`websockets` library), both ends in this process on uvloop: round trip p50 and p99, and CPU
per round trip (both ends together).

    .venv/bin/python -m bench.transport_echo [--rounds 5000]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # grpc's C core logs its own shutdown

import grpc
import grpc.aio
import uvloop
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

METHOD = "/bench.Echo/Open"
MESSAGE = b"x" * 200


async def _measure(
    name: str,
    rounds: int,
    send: Callable[[bytes], Awaitable[Any]],
    receive: Callable[[], Awaitable[Any]],
) -> str:
    """`rounds` round trips of MESSAGE: latency of each, CPU of all."""
    latencies = []
    cpu = time.process_time()
    for _ in range(rounds):
        started = time.perf_counter()
        await send(MESSAGE)
        await receive()
        latencies.append(time.perf_counter() - started)
    return _figures(name, latencies, time.process_time() - cpu)


def _figures(name: str, latencies: list[float], cpu: float) -> str:
    latencies.sort()
    rounds = len(latencies)
    p50 = latencies[rounds // 2] * 1e6
    p99 = latencies[int(rounds * 0.99)] * 1e6
    return f"{name:<12} p50 {p50:6.0f} us   p99 {p99:6.0f} us   CPU {cpu / rounds * 1e6:6.0f} us"


class _Echo(grpc.GenericRpcHandler):  # type: ignore[misc]
    def service(self, details: Any) -> Any:
        async def echo(_requests: Any, context: grpc.aio.ServicerContext) -> None:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                await context.write(message)

        return grpc.stream_stream_rpc_method_handler(echo)


async def grpc_echo(rounds: int) -> str:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_Echo(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(METHOD)()
        figures = await _measure("grpc.aio", rounds, call.write, call.read)
        call.cancel()
    await server.stop(None)
    return figures


async def websocket_echo(rounds: int) -> str:
    async def echo(connection: ServerConnection) -> None:
        async for message in connection:
            await connection.send(message)

    async with serve(echo, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as connection:
            return await _measure("websockets", rounds, connection.send, connection.recv)


async def main(rounds: int) -> None:
    print(f"{rounds} round trips of {len(MESSAGE)} bytes, both ends in this process (uvloop)")
    print(await grpc_echo(rounds))
    print(await websocket_echo(rounds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5000)
    uvloop.run(main(parser.parse_args().rounds))
