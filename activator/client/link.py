"""One open lease channel (`activator/channel.py`) as `ChannelLeases` uses it: a writer that
sends what queued up as one frame, a reader that hands each answer to its caller and the
activator's news (id 0) to whoever heeds it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import websockets
import websockets.asyncio.client
from websockets.asyncio.client import ClientConnection

from wakeful.activator.channel import FRAME_BYTES, MAX_OPS_PER_FRAME, TRY_AGAIN_LATER
from wakeful.domain.leases import Unauthorized, Unreachable


class Link:
    """One open channel: a writer that sends what queued up as one frame, a reader that
    hands each answer to its caller."""

    def __init__(self, connection: ClientConnection, on_lost: Callable[[], None]) -> None:
        self._connection = connection
        self._on_lost = on_lost
        self.on_news: Callable[[dict[str, Any]], None] = lambda news: None
        """Told what the activator sends unasked (id 0, `activator/channel.py`)."""
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._abandoned: set[int] = set()
        """Acquires given up by their callers: the grant that may still come is released."""
        self._outbox: list[dict[str, Any]] = []
        self._queued = asyncio.Event()
        self.alive = True
        self._tasks = [
            asyncio.ensure_future(self._read()),
            asyncio.ensure_future(self._write()),
        ]

    @classmethod
    async def open(cls, url: str, headers: dict[str, str], on_lost: Callable[[], None]) -> Link:
        try:
            with anyio.fail_after(10):
                connection = await websockets.asyncio.client.connect(
                    url,
                    additional_headers=headers,
                    max_size=16 << 20,
                    compression=None,
                    open_timeout=None,
                )
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise Unauthorized(f"the activator refused the token ({status})") from exc
            raise Unreachable(f"the activator refused the lease channel: {status}", 1) from exc
        except (OSError, TimeoutError, websockets.WebSocketException) as exc:
            raise Unreachable(f"the activator did not answer: {exc!r}", 1) from exc
        return cls(connection, on_lost)

    @property
    def refused(self) -> bool:
        """Closed by the activator with 1013 ("try again later"): it would not keep this
        channel (a bound on channels, a standby), rather than lost."""
        return self._connection.close_code == TRY_AGAIN_LATER

    def send(self, operation: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if not self.alive:
            future.set_exception(Unreachable("the lease channel was lost", 1))
            return future
        self._waiting[operation["id"]] = future
        self._queue(operation)
        return future

    def abandon(self, ident: int, op: str, answered: asyncio.Future[dict[str, Any]]) -> None:
        """The caller stopped waiting for `ident`'s answer (cancelled, or out of time)."""
        if op != "acquire" or not self.alive:
            self._waiting.pop(ident, None)
            return
        if self._waiting.pop(ident, None) is not None:
            self._abandoned.add(ident)
            self._queue({"op": "cancel", "of": ident})
        elif answered.done() and not answered.cancelled() and answered.exception() is None:
            self._release_unheld(ident, answered.result())  # answered as the caller left

    def ride(self, ident: int, by: int) -> None:
        """Requests joined (left) acquire `ident` while it is out: the activator counts it so."""
        if self.alive and ident in self._waiting:
            self._queue({"op": "ride", "of": ident, "by": by})

    def _release_unheld(self, ident: int, answer: dict[str, Any]) -> None:
        grant = answer.get("grant")
        if grant is not None:  # nobody holds it
            self._queue({"id": -ident, "op": "release", "lease": grant["lease_id"]})

    def _queue(self, operation: dict[str, Any]) -> None:
        self._outbox.append(operation)
        self._queued.set()

    async def _write(self) -> None:
        try:
            while True:
                await self._queued.wait()
                self._queued.clear()
                batch, self._outbox = self._outbox, []
                for frame in frames(batch):
                    await self._connection.send(frame)
        except (websockets.WebSocketException, OSError):
            self._lost()

    async def _read(self) -> None:
        try:
            async for frame in self._connection:
                for answer in json.loads(frame):
                    self._answered(answer)
        except (websockets.WebSocketException, OSError, ValueError, TypeError, KeyError):
            pass  # a lost connection, or answers that are not the protocol: the link is done
        self._lost()

    def _answered(self, answer: dict[str, Any]) -> None:
        ident = answer["id"]
        if ident == 0:  # news, not an answer
            self.on_news(answer)
            return
        future = self._waiting.pop(ident, None)
        if future is not None:
            if future.cancelled():  # its caller was cancelled in this same step: it is gone
                self._release_unheld(ident, answer)
            elif not future.done():
                future.set_result(answer)
            return
        if ident in self._abandoned:  # granted before the cancel arrived, or cancelled
            self._abandoned.discard(ident)
            self._release_unheld(ident, answer)

    def _lost(self) -> None:
        if not self.alive:
            return
        self.alive = False
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(Unreachable("the lease channel was lost", 1))
        for task in self._tasks:
            task.cancel()
        self._on_lost()

    async def close(self) -> None:
        self._lost()
        await self._connection.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def frames(batch: list[dict[str, Any]]) -> Iterator[str]:
    """Frames within the activator's bounds: at most `MAX_OPS_PER_FRAME` operations and about
    `FRAME_BYTES` each (a traffic report is large: counted by bytes, not by operations, a
    batch of them would pass the activator's `MAX_FRAME_BYTES` and close the channel)."""
    parts: list[str] = []
    size = 0
    for operation in batch:
        part = json.dumps(operation)
        if parts and (size + len(part) > FRAME_BYTES or len(parts) >= MAX_OPS_PER_FRAME):
            yield "[" + ",".join(parts) + "]"
            parts, size = [], 0
        parts.append(part)
        size += len(part) + 1
    if parts:
        yield "[" + ",".join(parts) + "]"
