"""Readiness probing: the first probe right after start, every 5 ms at most during the first
second, then backing off to ~100 ms.

An HTTP check (GET `path`; a 2xx or 3xx answer is ready) when the app
names a health path, a TCP connect otherwise. Stops early when the process exits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

FIRST_DELAY = 0.002
FAST_DELAY = 0.005
"""During the first second, probes at most this far apart: most apps get ready then, and a
coarser step adds up to its own length to every cold start (measured: ~90 ms at p50 with
100 ms steps; with 20 ms steps `bench/coldstart.py` still showed ~10 ms of waiting). A probe
of a port nobody listens on yet is one refused loopback connect: ~200 a second cost little."""
FAST_PHASE = 1.0
MAX_DELAY = 0.1


async def probe_once(host: str, port: int, path: str | None) -> bool:
    try:
        with anyio.fail_after(2):
            async with await anyio.connect_tcp(host, port) as stream:
                if path is None:
                    return True
                request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                await stream.send(request.encode())
                head = b""
                while b"\r\n" not in head and len(head) < 1024:
                    head += await stream.receive(1024)
    except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
        return False
    parts = head.split(b" ", 2)
    return len(parts) >= 2 and parts[1][:1] in (b"2", b"3")


async def wait_ready(
    host: str,
    port: int,
    path: str | None,
    within: float,
    exited: Callable[[], Awaitable[int]],
) -> bool:
    """True once a probe succeeds; False on timeout or when the process exits first."""
    ready = False
    async with anyio.create_task_group() as tasks:

        async def until_exit() -> None:
            await exited()
            tasks.cancel_scope.cancel()

        tasks.start_soon(until_exit)
        with anyio.move_on_after(within):
            started = anyio.current_time()
            delay = FIRST_DELAY
            while not await probe_once(host, port, path):
                await anyio.sleep(delay)
                fast = anyio.current_time() - started < FAST_PHASE
                delay = min(delay * 2, FAST_DELAY if fast else MAX_DELAY)
            ready = True
        tasks.cancel_scope.cancel()
    return ready
