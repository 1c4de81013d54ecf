"""What bounds the upstream connections: idle ones pooled per sandbox, exchanges per app.

- **Pools.** Idle connections are kept per sandbox address (at most `MAX_IDLE_PER_SANDBOX`),
  the most recently used taken first. A sandbox behind a tunnel (`tunnel://NODE/SANDBOX`) has
  a `TunnelPool`: every exchange takes a stream of its own, and a clean end gives the stream
  back to the node.
- **Slots.** At most `per_app` exchanges of one app hold a connection at once, and at most
  `total` over every app. A request past either waits up to `wait` seconds for a slot, first
  come first served within its app, then gets `UpstreamBusy` (503 + Retry-After). One app
  with a thousand open streams cannot take the connections every other app needs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from wakeful.ingress.errors import UpstreamBusy
from wakeful.ingress.upstream.bases import Home
from wakeful.ingress.upstream.connection import UpstreamConnection

MAX_IDLE_PER_SANDBOX: Final = 256

Dialer = Callable[[str, str, asyncio.Protocol], Awaitable[asyncio.Transport]]
"""Opens a connection to a tunnelled node's sandbox (node, sandbox id, protocol)."""


class Pool(Home):
    """Idle connections to one sandbox address."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: collections.deque[UpstreamConnection] = collections.deque()

    def give_back(self, conn: UpstreamConnection) -> None:
        if len(self.idle) >= MAX_IDLE_PER_SANDBOX:
            conn.close()
            return
        self.idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def take(self) -> UpstreamConnection | None:
        while self.idle:
            conn = self.idle.pop()  # the most recently used: least likely to be closing
            if not conn.closed:
                return conn
        return None


class TunnelPool(Pool):
    """A sandbox on a node reached through its tunnel (`tunnel://NODE/SANDBOX`,
    `ingress.nodestreams`): every exchange takes a stream of its own, and a clean end gives
    the stream back to the node's idle streams (the node keeps its socket to the sandbox)."""

    def __init__(self, node: str, sandbox: str) -> None:
        super().__init__(node, 0)
        self.node = node
        self.sandbox = sandbox

    def give_back(self, conn: UpstreamConnection) -> None:
        conn.release_stream()

    def take(self) -> UpstreamConnection | None:
        return None


@dataclass
class Slots:
    """How many exchanges hold a connection, per app and in all; who waits for one. Waiters
    queue per app, first come first served within an app: a request of an app below its
    share never waits behind another app's queue."""

    per_app: int
    total: int
    wait: float
    busy: dict[str, int] = field(default_factory=dict)
    """Per app with any, its exchanges holding a connection (a plain dict: compiled, a
    `Counter`'s item is a call through the interpreter)."""
    in_use: int = 0
    waiters: dict[str, collections.deque[asyncio.Future[None]]] = field(default_factory=dict)

    def _free(self, app: str) -> bool:
        return self.in_use < self.total and self.busy.get(app, 0) < self.per_app

    def try_take(self, app: str) -> bool:
        """Take a slot now if one is free and nobody of `app` waits for one."""
        busy = self.busy.get(app, 0)
        if self.in_use < self.total and busy < self.per_app and not self.waiters.get(app):
            self.busy[app] = busy + 1
            self.in_use += 1
            return True
        return False

    async def take(self, app: str) -> None:
        """A slot, waiting for one at most `wait` seconds (UpstreamBusy past it)."""
        if self.try_take(app):
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self.waiters.setdefault(app, collections.deque())
        queue.append(waiter)
        try:
            async with asyncio.timeout(self.wait):
                await waiter
        except BaseException as exc:
            granted = waiter.done() and not waiter.cancelled()
            if isinstance(exc, TimeoutError):
                if granted:
                    return  # granted just as the wait ran out: it is ours
                raise UpstreamBusy(
                    f"app {app!r} has {self.busy.get(app, 0)} requests in flight to its sandboxes "
                    f"(at most {self.per_app}; {self.in_use} of {self.total} in all) and "
                    f"none finished within {self.wait:g} s",
                    retry_after=1,
                ) from None
            if granted:
                self.give_back(app)  # granted as it was cancelled: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
            if not queue and self.waiters.get(app) is queue:
                del self.waiters[app]

    def _hold(self, app: str) -> None:
        self.busy[app] = self.busy.get(app, 0) + 1
        self.in_use += 1

    def give_back(self, app: str) -> None:
        busy = self.busy[app] - 1
        if busy:
            self.busy[app] = busy
        else:
            del self.busy[app]
        self.in_use -= 1
        if not self.waiters:
            return
        self._grant(app)  # its own queue first: only it was short of its share
        for other in list(self.waiters):  # then whoever waited for the total
            if self.in_use >= self.total:
                break
            self._grant(other)

    def _grant(self, app: str) -> None:
        queue = self.waiters.get(app)
        while queue and self._free(app):
            waiter = queue.popleft()
            if not waiter.done():
                self._hold(app)
                waiter.set_result(None)
