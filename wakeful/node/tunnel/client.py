"""A dial-out node's end of its tunnels to the ingress tier (seed 003).

With `WAKEFUL_TUNNEL` set, the node agent is never dialed: it opens streams (one WebSocket
each, `wakeful.domain.tunnelwire`) through the load balancer in front of the ingress
replicas, and each replica hands requests for this node's sandboxes to the streams that landed
on it. The node cannot choose where a stream lands, so it sizes its streams per replica, from
what each replica's streams carry, every second (`wakeful.domain.coverage`): grow where calls
are in flight and every stream is busy, fill toward the reserve where a replica is short,
evacuate a replica the balancer starves, prune what sat unused. It publishes each replica's
streams, busy, budget and state in its node record (`Node.tunnel`, when `decisions.
worth_publishing` says so), which is also how the activator learns whether it is reachable at
all and how replicas learn where to relay.

What a stream carries, once open, is `exchange.Carrier`'s: byte pipes to this node's own
sandboxes, and nothing else on its network.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import websockets
from websockets.asyncio.client import connect

from wakeful.domain import coverage
from wakeful.domain import tunnelwire as wire
from wakeful.domain.backoff import Backoff, Retries
from wakeful.domain.models import ReplicaCoverage, Tunnel

from .decisions import OpenFailure, open_failure, worth_publishing
from .exchange import Carrier, Stream, Targets
from .url import parse_url

log = logging.getLogger(__name__)

OPEN_BACKOFF = Backoff(0.5, cap=30.0)
"""Between attempts to open a stream while they fail (a refusal for now, a 503, is not one)."""

WS_OPTIONS: dict[str, Any] = {**wire.WEBSOCKET_OPTIONS, "open_timeout": 15}

Publish = Callable[[Tunnel], Awaitable[None]]


class TunnelClient:
    """Opens, carries and sizes this node's streams until cancelled."""

    def __init__(
        self,
        url: str,
        node: str,
        token: str,
        targets: Targets,
        publish: Publish,
        *,
        limits: coverage.Limits | None = None,
        ca_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 1.0,
    ) -> None:
        self.ingress = parse_url(url)
        self.node = node
        self._token = token
        self._publish = publish
        self.limits = limits or coverage.Limits()
        self._ca_file = ca_file
        self._clock = clock
        self._tick = tick
        self.streams: dict[int, Stream] = {}
        self._opening = 0
        self._ids = 0
        self._ssl: ssl.SSLContext | None = None
        self._carrier = Carrier(node, targets, clock)
        self.known: set[str] = set()
        self.memory = coverage.Memory()
        self.actions: collections.Counter[str] = collections.Counter()
        self._retries = Retries(OPEN_BACKOFF)
        self._retry_at = 0.0
        self._published: Tunnel | None = None
        self._published_at = -1e9
        self._reachable_since = time.time()
        self._tasks: anyio.abc.TaskGroup | None = None

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                while True:
                    await self.tick_once()
                    await anyio.sleep(self._tick)
        finally:
            self._carrier.close()

    @property
    def reachable(self) -> bool:
        return any(s.replica for s in self.streams.values())

    async def tick_once(self) -> None:
        """One sizing tick (seed 003): plan from the streams per replica, carry it out,
        keep idle streams alive, publish the table."""
        now = self._clock()
        landed = [s for s in self.streams.values() if s.replica and not s.closing]
        views = [
            coverage.Stream(
                id=s.id,
                replica=s.replica,
                busy=s.busy,
                opened_at=s.opened_at,
                last_used=s.last_used,
            )
            for s in landed
        ]
        plan = coverage.plan(views, self.known, self.memory, now, self.limits)
        self.memory = plan.memory
        backing_off = now < self._retry_at
        # Counted as carried out: while opens back off, growth and fills are not.
        self.actions.update(
            {a: n for a, n in plan.actions.items() if not (backing_off and a in ("grow", "fill"))}
        )
        for sid in plan.close:
            stream = self.streams.get(sid)
            if stream is not None and not stream.busy:
                self._close(stream)
        opens = max(0, plan.open - self._opening)
        if opens and not backing_off and self._tasks is not None:
            for _ in range(opens):
                self._tasks.start_soon(self._open_stream)
        await self._publish_table(plan, now)

    def _close(self, stream: Stream) -> None:
        """Ask the replica to take the stream out of use (DRAIN); it is closed once the
        replica answers DRAINED, after any exchange that took it meanwhile."""
        stream.closing = True
        if self._tasks is not None:

            async def drain() -> None:
                with contextlib.suppress(Exception):
                    await stream.send(wire.DRAIN_MESSAGE)

            self._tasks.start_soon(drain)

    async def _publish_table(self, plan: coverage.Plan, now: float) -> None:
        reachable = self.reachable
        table = Tunnel(
            reachable=reachable,
            replicas=[
                ReplicaCoverage(
                    replica=r.replica,
                    streams=r.streams,
                    busy=r.busy,
                    budget=r.budget,
                    state=str(r.state),
                )
                for r in plan.replicas
            ][:256],
            since=self._reachable_since,
            actions=dict(self.actions),
        )
        last = self._published
        if last is not None and last.reachable != reachable:
            self._reachable_since = time.time()
            table = table.model_copy(update={"since": self._reachable_since})
        if not worth_publishing(last, table, now, self._published_at):
            return
        try:
            await self._publish(table)
        except Exception as exc:  # the store is away: the next tick tries again
            log.warning("could not publish the tunnel table: %s", exc)
            return
        self._published = table
        self._published_at = now

    # -- streams -------------------------------------------------------------------------------

    def _context(self) -> ssl.SSLContext | None:
        if not self.ingress.secure:
            return None
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self._ca_file)
        return self._ssl

    async def _open_stream(self) -> None:
        if len(self.streams) + self._opening >= self.limits.node_cap:
            return
        self._opening += 1
        self._ids += 1
        sid = self._ids
        stream = Stream(sid, self._clock())
        self.streams[sid] = stream
        try:
            try:
                stream.connection = await connect(
                    self.ingress.url,
                    additional_headers={
                        "Authorization": f"Bearer {self._token}",
                        wire.NODE_HEADER: self.node,
                    },
                    ssl=self._context(),
                    **WS_OPTIONS,
                )
                await stream.send(wire.hello({"node": self.node}))
                async with asyncio.timeout(15):
                    answer = await stream.recv()
                if answer is None:
                    raise wire.WireError("the replica closed the stream at once")
                fields = wire.read_hello(answer)
            except (OSError, TimeoutError, websockets.WebSocketException, wire.WireError) as exc:
                self._opening -= 1
                self._failed(exc)
                return
            replica = fields.get("replica")
            if not isinstance(replica, str) or not replica:
                self._opening -= 1
                self._failed(wire.WireError("the replica's hello names no replica"))
                return
            peers = fields.get("replicas")
            if isinstance(peers, list):
                self.known = {p for p in peers if isinstance(p, str) and p} | {replica}
            stream.replica = replica
            stream.opened_at = stream.last_used = self._clock()
            self._opening -= 1
            self._retries.succeeded()
            await self._carrier.carry(stream)
        except asyncio.CancelledError:
            raise
        except (websockets.ConnectionClosed, OSError) as exc:
            if not stream.closing:
                log.info("tunnel stream %d to %s ended: %s", sid, stream.replica, exc)
        except Exception as exc:
            log.warning("tunnel stream %d to %s ended: %s", sid, stream.replica, exc)
        finally:
            self.streams.pop(sid, None)
            if stream.connection is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await stream.connection.close()

    def _failed(self, exc: BaseException) -> None:
        status = exc.response.status_code if isinstance(exc, websockets.InvalidStatus) else None
        failure = open_failure(status)
        if failure is OpenFailure.FOR_NOW:
            log.info("a tunnel stream was refused for now: %s", _why(exc))
            return
        pause = self._retries.failed()
        self._retry_at = self._clock() + pause
        log.log(
            logging.ERROR if failure is OpenFailure.REFUSED else logging.WARNING,
            "could not open a tunnel stream to %s: %s; retrying in %.1f s",
            self.ingress.url,
            _why(exc),
            pause,
        )


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
