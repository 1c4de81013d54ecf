"""One stream a node opened to this replica (a WebSocket): its reader loop, which hands the
messages of the exchange in progress to that exchange's `Receiver`, and its end. A stream is
idle or carries one exchange; the node may ask to take it out of use (DRAIN)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

from websockets.asyncio.server import ServerConnection

from wakeful.domain import tunnelwire as wire
from wakeful.ingress.nodestreams.connections import receive, spawn
from wakeful.ingress.nodestreams.exchange import Receiver, TunnelClosed

if TYPE_CHECKING:
    from wakeful.ingress.nodestreams.hub import StreamHub

log = logging.getLogger(__name__)


class NodeStream:
    """One stream a node opened to this replica: its reader loop, and the exchange it
    carries (None while idle)."""

    _ids = itertools.count(1)

    def __init__(
        self, hub: StreamHub, node: str, connection: ServerConnection, digest: str = ""
    ) -> None:
        self.id = next(self._ids)
        self.hub = hub
        self.node = node
        self.digest = digest
        """The sha256 of the token that opened it: revoked or rotated, the stream is closed."""
        self.draining = False
        """The node asked to close it (DRAIN): it carries no new exchange."""
        self.what = f"the tunnel of node {node!r} on ingress replica {hub.replica!r}"
        self._connection = connection
        self._lock = asyncio.Lock()
        self.receiver: Receiver | None = None
        self.opened_at = time.monotonic()
        self._tags = itertools.count(1)

    def next_tag(self) -> int:
        return next(self._tags) % 256

    async def send(self, message: bytes) -> None:
        async with self._lock:
            await self._connection.send(message)

    def close(self) -> None:
        spawn(self._connection.close(1008, "its token was revoked"))

    def retire(self) -> None:
        """Out of use at the node's request: DRAINED tells the node nothing more comes, and
        the replica closes the connection itself (a stream out of the hub must not outlive
        its caps and its token's revocation because a node kept it open)."""
        self.hub.remove(self)

        async def drained() -> None:
            await self.send(wire.DRAINED_MESSAGE)
            await self._connection.close(1000, "drained")

        spawn(drained())

    async def serve(self) -> None:
        """Read until the node closes the stream or it breaks; hand messages to the exchange."""
        error: BaseException = TunnelClosed("the node closed the stream")
        try:
            while True:
                receiver = self.receiver
                if receiver is not None and not receiver.readable():
                    await receiver.wait_readable()
                    continue
                message = await receive(self._connection)
                if not message:
                    return
                kind = message[0]
                if kind == wire.DRAIN:
                    self.draining = True
                    if self.receiver is None:  # idle: out of use at once; else at its end
                        self.retire()
                elif self.receiver is not None:
                    self.receiver.on_message(message)
                elif kind not in wire.ANSWERS:  # an answer to an exchange over: dropped
                    raise wire.WireError(f"message kind {kind!r} on an idle stream")
        except wire.WireError as exc:
            log.warning("%s: closed, it broke the protocol: %s", self.what, exc)
            error = exc
        except asyncio.CancelledError:
            error = TunnelClosed("the replica is stopping")
            raise
        except Exception as exc:
            error = exc
        finally:
            self.hub.remove(self)
            receiver, self.receiver = self.receiver, None
            if receiver is not None:
                receiver.on_lost(error)
