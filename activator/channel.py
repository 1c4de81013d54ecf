"""The lease channel: the lease protocol over one WebSocket per ingress, many calls in flight.

Over HTTP every acquire, renewal and release is a request of its own through uvicorn and
FastAPI, which held the lease path between processes to ~500 calls a second. On the channel an
ingress sends batches of operations and gets batches of answers back; each side sends
whatever queued up while its last frame was on the way, so under load one frame carries many.

Frames are JSON text. The ingress sends a list of operations, each with an `id` of its
choosing (unique among its operations in flight):

    {"id": 1, "op": "acquire", "app": "hello", "version": null}
    {"id": 2, "op": "renew", "lease": "L", "used": true}
    {"id": 3, "op": "release", "lease": "L"}
    {"id": 4, "op": "cancel", "of": 1}          (no answer of its own)

and gets a list of answers, exactly one per acquire, renewal and release:

    {"id": 1, "grant": {...LeaseGrant...}}
    {"id": 3, "released": true}
    {"id": 2, "error": "lease gone", "detail": "...", "retry_after": 1}

An acquire parks (bounded) like `POST /v1/leases`; a `cancel` of it, or the channel closing,
takes it out of the waiters at once (seed 001), and a lease granted in the same step is handed
straight back, so the activator never counts a lease nobody holds. A cancelled acquire is
answered with the error `cancelled`. Grants queued but never sent when the channel closes are
released too. Leases already held outlive the channel: they are renewed on the next one.

Bounds: at most `MAX_OPS_PER_FRAME` operations per frame and `MAX_IN_FLIGHT` acquires per
channel (past it, an acquire is answered `overloaded` with a Retry-After); while more than
`MAX_UNSENT` answers wait for the ingress to read them, the channel reads nothing more. A frame
that is not a list of valid operations closes the channel with 1007 and a reason; nothing
half-done stays behind (parked acquires are cancelled as on any close).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import anyio
import anyio.abc
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.websockets import WebSocket

from wakeful.activator.core import Activator
from wakeful.activator.ledger import Lease
from wakeful.domain.leases import (
    ActivatorError,
    AppFailedToBoot,
    LeaseGone,
    Unavailable,
    UnknownApp,
)
from wakeful.domain.models import NAME_PATTERN
from wakeful.store import StoreError

log = logging.getLogger(__name__)

PATH = "/v1/leases/channel"
MAX_OPS_PER_FRAME = 1000
MAX_IN_FLIGHT = 10_000
MAX_UNSENT = 10_000
INVALID_FRAME = 1007


class Acquire(BaseModel):
    id: int
    op: Literal["acquire"]
    app: str = Field(pattern=NAME_PATTERN)
    version: str | None = Field(default=None, pattern=NAME_PATTERN)


class Renew(BaseModel):
    id: int
    op: Literal["renew"]
    lease: str = Field(max_length=200)
    used: bool = False


class Release(BaseModel):
    id: int
    op: Literal["release"]
    lease: str = Field(max_length=200)


class Cancel(BaseModel):
    op: Literal["cancel"]
    of: int


Operation = Annotated[Acquire | Renew | Release | Cancel, Field(discriminator="op")]
_OPERATIONS: TypeAdapter[list[Operation]] = TypeAdapter(list[Operation])


def error_answer(exc: ActivatorError | StoreError) -> dict[str, Any]:
    """The error fields of an answer; the same names `POST /v1/leases` answers with."""
    if isinstance(exc, StoreError):
        return {"error": "store unavailable", "detail": str(exc), "retry_after": 1}
    if isinstance(exc, UnknownApp):
        return {"error": "unknown app", "detail": str(exc)}
    if isinstance(exc, LeaseGone):
        return {"error": "lease gone", "detail": str(exc)}
    if isinstance(exc, AppFailedToBoot):
        found: dict[str, Any] = {"error": "app failed to boot", "detail": str(exc)}
        return found | {"retry_after": exc.retry_after, "log": exc.log}
    if isinstance(exc, Unavailable):
        return {"error": "no capacity", "detail": str(exc), "retry_after": exc.retry_after}
    return {"error": "activator error", "detail": str(exc)}


class Channel:
    """One ingress's channel, from the accepted WebSocket to its close."""

    def __init__(self, websocket: WebSocket, activator: Activator) -> None:
        self._ws = websocket
        self._activator = activator
        self._unsent: list[dict[str, Any]] = []
        self._queued = anyio.Event()
        self._room = anyio.Event()
        self._acquires: dict[int, anyio.CancelScope] = {}

    async def serve(self) -> None:
        await self._ws.accept()
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._write)
                await self._read(tasks)
                tasks.cancel_scope.cancel()
        finally:
            self._release_unsent()

    async def _read(self, tasks: anyio.abc.TaskGroup) -> None:
        while True:
            while len(self._unsent) > MAX_UNSENT:  # the ingress does not read: neither do we
                self._room = anyio.Event()
                await self._room.wait()
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await self._close("frames are JSON text")
                return
            try:
                operations = _OPERATIONS.validate_json(text)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                await self._close(f"invalid operation at {where}: {first['msg']}")
                return
            if len(operations) > MAX_OPS_PER_FRAME:
                await self._close(f"more than {MAX_OPS_PER_FRAME} operations in one frame")
                return
            for operation in operations:
                self._start(operation, tasks)

    def _start(self, operation: Operation, tasks: anyio.abc.TaskGroup) -> None:
        if isinstance(operation, Cancel):
            scope = self._acquires.get(operation.of)
            if scope is not None:
                scope.cancel()
        elif isinstance(operation, Acquire):
            if operation.id in self._acquires:  # its answer would be ambiguous
                self._answer(
                    {"id": operation.id, "error": "activator error", "detail": "id in use"}
                )
            elif len(self._acquires) >= MAX_IN_FLIGHT:
                detail = f"more than {MAX_IN_FLIGHT} acquires in flight on this channel"
                self._answer(
                    {"id": operation.id, "error": "no capacity", "detail": detail, "retry_after": 1}
                )
            else:
                scope = self._acquires[operation.id] = anyio.CancelScope()
                tasks.start_soon(self._acquire, operation, scope)
        else:
            self._answer(self._upkeep(operation))

    def _upkeep(self, operation: Renew | Release) -> dict[str, Any]:
        try:
            if isinstance(operation, Renew):
                lease = self._activator.renew(operation.lease, used=operation.used)
                return {"id": operation.id, "grant": _grant(lease)}
            self._activator.release(operation.lease)
            return {"id": operation.id, "released": True}
        except (ActivatorError, StoreError) as exc:
            return {"id": operation.id, **error_answer(exc)}

    async def _acquire(self, operation: Acquire, scope: anyio.CancelScope) -> None:
        lease: Lease | None = None
        answer: dict[str, Any] = {"id": operation.id, "error": "cancelled", "detail": "cancelled"}
        try:
            with scope:
                try:
                    lease = await self._activator.acquire(operation.app, operation.version)
                except (ActivatorError, StoreError) as exc:
                    answer = {"id": operation.id, **error_answer(exc)}
            if lease is not None and scope.cancel_called:  # granted as it was cancelled
                self._activator.release(lease.lease_id)
                lease = None
            if lease is not None:
                answer = {"id": operation.id, "grant": _grant(lease), "_lease": lease.lease_id}
        finally:
            del self._acquires[operation.id]
            self._answer(answer)  # released by `serve` if the channel closes before it is sent

    def _answer(self, answer: dict[str, Any]) -> None:
        self._unsent.append(answer)
        self._queued.set()

    async def _write(self) -> None:
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            batch, self._unsent = self._unsent, []
            self._room.set()
            # Once handed to the socket a grant may have reached the ingress: if this send
            # fails, its leases are not released here but expire (never counted twice).
            await self._ws.send_text(json.dumps(list(_public(batch))))

    def _release_unsent(self) -> None:
        """Grants that never reached the ingress: nobody holds them."""
        for answer in self._unsent:
            lease_id = answer.get("_lease")
            if lease_id is not None:
                self._activator.release(lease_id)
        self._unsent = []

    async def _close(self, reason: str) -> None:
        log.warning("closing a lease channel: %s", reason)
        with anyio.move_on_after(5):
            await self._ws.close(INVALID_FRAME, reason[:120])


def _grant(lease: Lease) -> dict[str, Any]:
    return lease.grant().model_dump(mode="json")


def _public(batch: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for answer in batch:
        yield {key: value for key, value in answer.items() if key != "_lease"}
