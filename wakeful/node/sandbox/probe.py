"""Readiness probing: the first probe right after start, every 1 ms during the first 0.2 s,
every 5 ms until 1 s, then backing off to ~100 ms.

An HTTP check (GET `path`; a 2xx or 3xx answer is ready) when the app names a health path, the
standard gRPC health check when it asks for one (`grpc_health`), a TCP connect otherwise.
Before each, a non-blocking connect (`knock`): to an address of this machine it is refused or
accepted by the time the call returns (~20 us, no task, no timer), so the port can be watched
every millisecond, and the full probe runs only once something listens. Stops early when the
process exits.
"""

from __future__ import annotations

import errno
import ipaddress
import select
import socket
from collections.abc import Awaitable, Callable
from enum import Enum

import anyio

from .grpc_health import serving

QUICK_DELAY = 0.001
QUICK_PHASE = 0.2
"""While apps usually get ready, the port is knocked on every millisecond: a 5 ms step cost
every cold start ~2.5 ms on average."""
FAST_DELAY = 0.005
"""During the first second, probes at most this far apart: most apps get ready then, and a
coarser step adds up to its own length to every cold start (measured: ~90 ms at p50 with
100 ms steps; with 20 ms steps `bench/coldstart.py` still showed ~10 ms of waiting). A probe
of a port nobody listens on yet is one refused loopback connect: ~200 a second cost little."""
FAST_PHASE = 1.0
MAX_DELAY = 0.1


class Knock(Enum):
    REFUSED = "refused"
    ACCEPTED = "accepted"
    UNKNOWN = "unknown"


def knock(host: str, port: int) -> Knock:
    """A non-blocking connect, closed at once: REFUSED when nothing listens, ACCEPTED when
    something does, UNKNOWN when the kernel did not say at once (or `host` is a name, which
    would need a lookup)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return Knock.UNKNOWN
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        code = sock.connect_ex((host, port))
        if code == errno.EINPROGRESS:  # a local handshake is over by the time it returns
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            if not poller.poll(0):
                return Knock.UNKNOWN
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code == errno.ECONNREFUSED:
        return Knock.REFUSED
    return Knock.ACCEPTED if code == 0 else Knock.UNKNOWN


async def probe(
    host: str,
    port: int,
    path: str | None,
    listening: Callable[[], bool] | None = None,
    grpc: bool = False,
) -> bool:
    """The full probe, unless a knock already answers it. `listening`: whether the app listens
    in a network namespace of its own, whose forwarder accepts on `port` before it does (so a
    knock there would say nothing): asked instead of the knock. `grpc`: the gRPC health
    check instead of an HTTP one."""
    if listening is not None:
        if not listening():
            return False
        return (path is None and not grpc) or await probe_once(host, port, path, grpc)
    knocked = knock(host, port)
    if knocked is Knock.REFUSED:
        return False
    if knocked is Knock.ACCEPTED and path is None and not grpc:
        return True
    return await probe_once(host, port, path, grpc)


async def probe_once(host: str, port: int, path: str | None, grpc: bool = False) -> bool:
    if grpc:
        with anyio.move_on_after(2):
            return await serving(host, port)
        return False
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
    listening: Callable[[], bool] | None = None,
    grpc: bool = False,
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
            delay = FAST_DELAY
            while not await probe(host, port, path, listening, grpc):
                elapsed = anyio.current_time() - started
                if elapsed < QUICK_PHASE:
                    await anyio.sleep(QUICK_DELAY)
                    continue
                await anyio.sleep(delay)
                delay = FAST_DELAY if elapsed < FAST_PHASE else min(delay * 2, MAX_DELAY)
            ready = True
        tasks.cancel_scope.cancel()
    return ready
