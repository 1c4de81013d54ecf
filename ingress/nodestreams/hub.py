"""Every node's streams on this replica, idle and busy: a request takes the node's newest idle
stream, or waits its turn for one to free (first come, first served); a stream that finishes
its exchange goes to the next waiter, or back to the idle ones. Caps per node and in all."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from wakeful.ingress.nodestreams.stream import NodeStream


@dataclass
class _NodeStreams:
    all: set[NodeStream] = field(default_factory=set)
    idle: list[NodeStream] = field(default_factory=list)
    """Idle streams, the most recently idle last: each exchange takes the newest, so the old
    ones stay idle and the node prunes them (seed 003)."""
    waiters: collections.deque[asyncio.Future[NodeStream]] = field(
        default_factory=collections.deque
    )


class StreamHub:
    """Every node's streams on this replica, idle and busy."""

    def __init__(self, replica: str, per_node: int, total: int) -> None:
        self.replica = replica
        self.per_node = per_node
        self.total = total
        self._nodes: dict[str, _NodeStreams] = {}
        self._count = 0

    def full(self, node: str) -> str | None:
        """Why one more stream of `node` is refused here, or None."""
        if self.holds(node) >= self.per_node:
            return f"node {node!r} holds {self.per_node} streams on replica {self.replica!r}"
        if self._count >= self.total:
            return f"replica {self.replica!r} holds {self.total} streams in all"
        return None

    def add(self, stream: NodeStream) -> bool:
        if self.full(stream.node) is not None:
            return False
        streams = self._nodes.setdefault(stream.node, _NodeStreams())
        streams.all.add(stream)
        self._count += 1
        self.idle(stream)
        return True

    def streams(self) -> list[NodeStream]:
        return [stream for streams in self._nodes.values() for stream in streams.all]

    def remove(self, stream: NodeStream) -> None:
        streams = self._nodes.get(stream.node)
        if streams is None or stream not in streams.all:
            return
        streams.all.discard(stream)
        self._count -= 1
        with contextlib.suppress(ValueError):
            streams.idle.remove(stream)
        if not streams.all and not streams.waiters:
            del self._nodes[stream.node]

    def idle(self, stream: NodeStream) -> None:
        """The stream finished its exchange (or just opened): the next waiter takes it."""
        stream.receiver = None
        streams = self._nodes.get(stream.node)
        if streams is None or stream not in streams.all:
            return
        if stream.draining:
            stream.retire()
            return
        while streams.waiters:
            waiter = streams.waiters.popleft()
            if not waiter.done():
                waiter.set_result(stream)
                return
        streams.idle.append(stream)

    def try_take(self, node: str) -> NodeStream | None:
        streams = self._nodes.get(node)
        if streams is None or not streams.idle:
            return None
        return streams.idle.pop()

    async def take(self, node: str, wait: float) -> NodeStream | None:
        """An idle stream of `node`, waiting up to `wait` seconds for one to free."""
        stream = self.try_take(node)
        if stream is not None:
            return stream
        streams = self._nodes.setdefault(node, _NodeStreams())
        waiter: asyncio.Future[NodeStream] = asyncio.get_running_loop().create_future()
        streams.waiters.append(waiter)
        try:
            async with asyncio.timeout(wait):
                return await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return waiter.result()  # granted in the very step the wait ran out
            return None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.idle(waiter.result())  # granted as it was cancelled: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                streams.waiters.remove(waiter)
            if not streams.all and not streams.waiters:
                self._nodes.pop(node, None)

    def holds(self, node: str) -> int:
        streams = self._nodes.get(node)
        return 0 if streams is None else len(streams.all)

    def idle_of(self, node: str) -> int:
        streams = self._nodes.get(node)
        return 0 if streams is None else len(streams.idle)

    def counts(self) -> Iterator[tuple[str, int, int]]:
        """(node, streams, idle) for every node with streams here."""
        for node, streams in self._nodes.items():
            if streams.all:
                yield node, len(streams.all), len(streams.idle)
