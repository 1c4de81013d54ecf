"""The lease channel: the lease protocol over one WebSocket per ingress, many calls in flight.

Over HTTP every acquire, renewal and release is a request of its own through uvicorn and
FastAPI, which held the lease path between processes to ~500 calls a second. On the channel an
ingress sends batches of operations and gets batches of answers back; each side sends
whatever queued up while its last frame was on the way, so under load one frame carries many.

Frames are JSON text. The ingress sends a list of operations, each with an `id` of its
choosing (unique among its operations in flight):

    {"id": 1, "op": "acquire", "app": "hello", "version": null, "requests": 3}
    {"id": 2, "op": "renew", "lease": "L", "used": true}
    {"id": 3, "op": "release", "lease": "L"}
    {"id": 4, "op": "cancel", "of": 1}          (no answer of its own)
    {"op": "ride", "of": 1, "by": 2}             (requests joined acquire 1; no answer)
    {"id": 5, "op": "adopt", "app": "hello", "grant": {...LeaseGrant...}}
    {"id": 6, "op": "traffic", "apps": {"hello": {"requests": 9, "errors": 0, "buckets": [...]}}}
    {"id": 7, "op": "access", "ingress": "edge-1", "lines": [{...AccessLine...}]}
    {"id": 8, "op": "routes", "ingress": "edge-1", "revision": 1234}   (null: it drains)

(`adopt`: a lease granted by another activator, reported by its holder on the first channel
it opens to this one after a takeover; answered like a renewal; `traffic`: what the ingress
answered per app since its last report, `wakeful.domain.traffic`, for the dashboard's charts;
`access`: its access lines since then, `wakeful.domain.logbatch.AccessLine`, for the log;
`routes`: the revision of `apps/` its routes have followed, `wakeful.aio.marks`, which a
deploy waits for; null when it drains, and forgotten then; kept a few seconds after the
channel closes, for the ingress's next channel)
and gets a list of answers, exactly one per acquire, renewal, release, adoption and report
(an error's code and fields are those of `activator/lease_errors.py`, as over HTTP):

    {"id": 1, "grant": {...LeaseGrant...}}
    {"id": 3, "released": true}
    {"id": 6, "recorded": 1}
    {"id": 2, "error": "lease gone", "detail": "..."}

and, unasked, news with the id 0 (which no operation has, so a client that knows no news
passes it by): a pool of the app turned short, and the ingress hands back the normal leases
of it it is not using (`activator.spares`; its renewals say so too, `spare_wanted`):

    {"id": 0, "short": {"app": "hello", "version": "v1"}}

An acquire parks (bounded) like `POST /v1/leases`, counted as the `requests` it stands for
(default 1: an ingress's misses that wait together share one acquire, `ingress.cache`); a
`cancel` of it, or the channel closing, takes it out of the waiters at once (seed 001), and a
lease granted in the same step is handed straight back, so the activator never counts a lease
nobody holds. A cancelled acquire is
answered with the error `cancelled`. Grants queued but never sent when the channel closes are
released too. Leases already held outlive the channel: they are renewed on the next one.

Bounds: at most `MAX_ADOPTS_PER_CHANNEL` leases reported per channel; frames of at most
`MAX_FRAME_BYTES` (uncompressed: the control API turns permessage-deflate off) and
`MAX_OPS_PER_FRAME` operations (the client cuts its frames by size too: a `traffic` report
names at most `MAX_APPS_PER_REPORT` apps, and many of them fill frames fast); at most
`MAX_IN_FLIGHT` acquires
per channel (past it, an acquire is answered `no capacity` with a Retry-After); while more than
`MAX_UNSENT` answers wait for the ingress to read them, the channel reads nothing more; answers
go out in frames of about `FRAME_BYTES`. An operation that is not the protocol but has an id is
answered with the error `invalid request` (as a 422 over HTTP: its neighbours go on); a frame
that is not JSON, not a list, too long, or holds an operation without an id closes the channel
with 1007 and a reason. The token the channel was opened with is checked at every frame and
every `TOKEN_CHECK_SECONDS` between them: once revoked, the channel closes with 1008, whether or
not the ingress still sends. One token holds at most `WAKEFUL_MAX_CHANNELS_PER_TOKEN` (1024)
channels at once (each ingress process keeps one open to the leader, and ingresses may share
a token); past it a new one is closed at once with 1013 ("try again later"), which the client
takes for a failed attempt (it opens no other for a second). Nothing half-done stays behind a close
(parked acquires are cancelled as on any close).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.abc
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from wakeful.activator.core import Activator
from wakeful.activator.lease_errors import CANCELLED, INVALID_REQUEST, WireError, to_wire
from wakeful.activator.ledger import Lease
from wakeful.activator.operations import (
    OPERATION,
    Access,
    Acquire,
    Adopt,
    Cancel,
    Operation,
    Release,
    Renew,
    Ride,
    Routes,
    Traffic,
)
from wakeful.aio.marks import Marks
from wakeful.domain.leases import (
    CHANNEL_MAX_FRAME_BYTES,
    MAX_ASK_REQUESTS,
    ActivatorError,
    Overloaded,
    Riders,
)
from wakeful.store import StoreError

log = logging.getLogger(__name__)

PATH = "/v1/leases/channel"
MAX_OPS_PER_FRAME = 1000
MAX_IN_FLIGHT = 10_000
MAX_UNSENT = 10_000
MAX_FRAME_BYTES = CHANNEL_MAX_FRAME_BYTES
FRAME_BYTES = 256 * 1024
"""Answers go out in frames of about this size at most."""
INVALID_FRAME = 1007
POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013
SERVICE_RESTART = 1012
TOKEN_CHECK_SECONDS = 1.0
MAX_CHANNELS_PER_TOKEN = 1024
"""The default of `ActivatorSettings.max_channels_per_token`: each ingress process keeps one
channel open to the leader, and ingresses (and all of one's workers) may share a token."""
MAX_ADOPTS_PER_CHANNEL = 100_000
"""Leases one channel may report holding (an ingress holds far fewer): the ledger stays
bounded whatever an ingress token sends."""


class Channel:
    """One ingress's channel, from the accepted WebSocket to its close."""

    def __init__(
        self,
        websocket: WebSocket,
        activator: Activator,
        routes_seen: Marks,
        allowed: Callable[[], bool] = lambda: True,
        scope: str = "",
    ) -> None:
        """`allowed`: whether the token the channel was opened with is still valid, asked at
        every frame (a revoked token's channel closes, as its next HTTP call would be 401).
        `routes_seen`: where the ingress's `routes` go; `scope`: the token's name, within
        which the ingress names it reports are its own."""
        self._ws = websocket
        self._routes_seen = routes_seen
        self._scope = scope
        self._activator = activator
        self._allowed = allowed
        self._unsent: list[dict[str, Any]] = []
        self._queued = anyio.Event()
        self._room = anyio.Event()
        self._acquires: dict[int, anyio.CancelScope] = {}
        self._riders: dict[int, Riders] = {}
        """The requests riding each acquire in flight, as the ingress says (`ride`)."""
        self._adopts = 0

    async def serve(self) -> None:
        await self._ws.accept()
        unheed = self._activator.spare_asks.heed(self._told_short)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._write, tasks)
                tasks.start_soon(self._watch_token, tasks)
                tasks.start_soon(self._watch_leading, tasks)
                await self._read(tasks)
                tasks.cancel_scope.cancel()
        finally:
            unheed()
            self._routes_seen.gone(self)
            self._release_unsent()

    def _told_short(self, app: str, version: str) -> None:
        """News, not an answer (id 0, which no operation has): a pool turned short. Left out
        while the ingress does not read (its renewals say it too)."""
        if len(self._unsent) <= MAX_UNSENT:
            self._answer({"id": 0, "short": {"app": app, "version": version}})

    async def refuse(self, reason: str) -> None:
        """Accept, then close at once with 1013 (a channel this token may not open now)."""
        await self._ws.accept()
        await self._close(reason, TRY_AGAIN_LATER)

    async def _watch_token(self, tasks: anyio.abc.TaskGroup) -> None:
        """A revoked token's channel closes even while the ingress sends nothing."""
        while True:
            await anyio.sleep(TOKEN_CHECK_SECONDS)
            if not self._allowed():
                await self._close("the token was revoked", POLICY_VIOLATION)
                tasks.cancel_scope.cancel()
                return

    async def _watch_leading(self, tasks: anyio.abc.TaskGroup) -> None:
        """An activator that stopped leading closes its channels (1012, "service restart"):
        their ingresses look the new leader up and make their acquires again there."""
        await self._activator.deposed.wait()
        await self._close("this activator stopped leading", SERVICE_RESTART)
        tasks.cancel_scope.cancel()

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
            if not self._allowed():
                await self._close("the token was revoked", POLICY_VIOLATION)
                return
            try:
                raw = json.loads(text)
            except ValueError as exc:
                await self._close(f"invalid operation: not JSON ({exc})")
                return
            if not isinstance(raw, list):
                await self._close("invalid operation: a frame is a list of operations")
                return
            if len(raw) > MAX_OPS_PER_FRAME:
                await self._close(f"more than {MAX_OPS_PER_FRAME} operations in one frame")
                return
            for index, item in enumerate(raw):
                try:
                    operation = OPERATION.validate_python(item)
                except ValidationError as exc:
                    if not await self._refuse(index, item, exc):
                        return
                    continue
                self._start(operation, tasks)

    async def _refuse(self, index: int, item: object, exc: ValidationError) -> bool:
        """An operation that is not the protocol: answered as an error when it has an id (like
        a 422 over HTTP, its neighbours unharmed), else the channel closes. False: closed."""
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = f"invalid operation at {index}.{where}: {first['msg']}"
        ident = item.get("id") if isinstance(item, dict) else None
        if type(ident) is not int:
            await self._close(detail)
            return False
        self._answer({"id": ident, **WireError(INVALID_REQUEST, detail[:500]).fields()})
        return True

    def _start(self, operation: Operation, tasks: anyio.abc.TaskGroup) -> None:
        if isinstance(operation, Cancel):
            scope = self._acquires.get(operation.of)
            if scope is not None:
                scope.cancel()
        elif isinstance(operation, Ride):
            riders = self._riders.get(operation.of)
            if riders is not None:  # else answered already: nothing to count
                # An ingress's count stays within 0..MAX_ASK_REQUESTS; a hostile one's too.
                target = min(max(riders.count + operation.by, 0), MAX_ASK_REQUESTS)
                riders.change(target - riders.count)
        elif isinstance(operation, Acquire):
            if operation.id in self._acquires:  # its answer would be ambiguous
                self._answer({"id": operation.id, **to_wire(ActivatorError("id in use")).fields()})
            elif len(self._acquires) >= MAX_IN_FLIGHT:
                detail = f"more than {MAX_IN_FLIGHT} acquires in flight on this channel"
                self._answer({"id": operation.id, **to_wire(Overloaded(detail, 1)).fields()})
            else:
                scope = self._acquires[operation.id] = anyio.CancelScope()
                self._riders[operation.id] = Riders(operation.requests)
                tasks.start_soon(self._acquire, operation, scope)
        else:
            self._answer(self._upkeep(operation))

    def _upkeep(
        self, operation: Renew | Release | Adopt | Traffic | Access | Routes
    ) -> dict[str, Any]:
        try:
            if isinstance(operation, Routes):
                seen = self._routes_seen
                if operation.revision is None:
                    seen.gone(self, linger=False)
                else:
                    twin = seen.saw(
                        self,
                        operation.ingress,
                        operation.revision,
                        self._scope,
                        operation.instance,
                    )
                    if twin is not None:
                        log.warning(
                            "two ingresses of %s call themselves %r: a deploy waits for both, "
                            "this one as %r, but their tunnels would collide; give each a name "
                            "of its own (WAKEFUL_TUNNEL_REPLICA)",
                            self._scope,
                            operation.ingress,
                            twin,
                        )
                return {"id": operation.id, "recorded": 1}
            if isinstance(operation, Access):
                # grpc_status is the one field that can be None: lines not of a call lack it.
                lines = [line.model_dump(exclude_none=True) for line in operation.lines]
                recorded = self._activator.record_access(operation.ingress, lines)
                return {"id": operation.id, "recorded": recorded}
            if isinstance(operation, Traffic):
                recorded = self._activator.record_traffic(operation.apps)
                return {"id": operation.id, "recorded": recorded}
            if isinstance(operation, Renew):
                renewed = self._activator.renew_grant(operation.lease, used=operation.used)
                return {"id": operation.id, "grant": renewed.model_dump(mode="json")}
            if isinstance(operation, Adopt):
                self._adopts += 1
                if self._adopts > MAX_ADOPTS_PER_CHANNEL:
                    detail = f"more than {MAX_ADOPTS_PER_CHANNEL} leases reported on a channel"
                    return {"id": operation.id, **to_wire(ActivatorError(detail)).fields()}
                lease = self._activator.adopt(operation.app, operation.grant)
                return {"id": operation.id, "grant": _grant(lease)}
            self._activator.release(operation.lease)
            return {"id": operation.id, "released": True}
        except (ActivatorError, StoreError) as exc:
            return {"id": operation.id, **to_wire(exc).fields()}

    async def _acquire(self, operation: Acquire, scope: anyio.CancelScope) -> None:
        lease: Lease | None = None
        answer: dict[str, Any] = {"id": operation.id, **WireError(CANCELLED, "cancelled").fields()}
        try:
            with scope:
                try:
                    lease = await self._activator.acquire(
                        operation.app, operation.version, riders=self._riders[operation.id]
                    )
                except (ActivatorError, StoreError) as exc:
                    answer = {"id": operation.id, **to_wire(exc).fields()}
            if lease is not None and scope.cancel_called:  # granted as it was cancelled
                self._activator.release(lease.lease_id)
                lease = None
            if lease is not None:
                answer = {"id": operation.id, "grant": _grant(lease), "_lease": lease.lease_id}
        finally:
            del self._acquires[operation.id]
            del self._riders[operation.id]
            # Released by `serve` if the channel closes before it is sent. Not answered when
            # this activator stopped leading: the channel closes, and the ingress makes the
            # acquire again on the new leader instead of failing its request.
            if lease is not None or not self._activator.deposed.is_set():
                self._answer(answer)

    def _answer(self, answer: dict[str, Any]) -> None:
        self._unsent.append(answer)
        self._queued.set()

    async def _write(self, tasks: anyio.abc.TaskGroup) -> None:
        """Send what is queued, in frames; when the ingress is gone, end the channel (a reader
        waiting for room would wait for ever)."""
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            batch, self._unsent = self._unsent, []
            self._room.set()
            for start, frame in _frames(batch):
                try:
                    await self._ws.send_text(frame)
                except BaseException as exc:
                    # uvicorn writes a frame only once the socket is writable, and nothing
                    # can fail after that: a send that raised (the ingress gone) or was
                    # cancelled (the channel closing) wrote nothing, so these grants reached
                    # no one and `serve` gives them back.
                    self._unsent = batch[start:] + self._unsent
                    if isinstance(exc, WebSocketDisconnect):
                        tasks.cancel_scope.cancel()
                        return
                    raise

    def _release_unsent(self) -> None:
        """Grants that never reached the ingress: nobody holds them."""
        for answer in self._unsent:
            lease_id = answer.get("_lease")
            if lease_id is not None:
                self._activator.release(lease_id)
        self._unsent = []

    async def _close(self, reason: str, code: int = INVALID_FRAME) -> None:
        log.warning("closing a lease channel: %s", reason[:500])
        short = reason.encode()[:120].decode(errors="ignore")  # a close reason: <= 123 bytes
        with anyio.move_on_after(5):
            await self._ws.close(code, short)


def _grant(lease: Lease) -> dict[str, Any]:
    return lease.grant().model_dump(mode="json")


def _frames(batch: list[dict[str, Any]]) -> Iterator[tuple[int, str]]:
    """(index of its first answer, text) for frames of at most ~`FRAME_BYTES` each (one
    answer alone may be longer: a boot log), without the private `_lease` field."""
    parts: list[str] = []
    size = start = 0
    for index, answer in enumerate(batch):
        part = json.dumps({key: value for key, value in answer.items() if key != "_lease"})
        if parts and size + len(part) > FRAME_BYTES:
            yield start, "[" + ",".join(parts) + "]"
            parts, size, start = [], 0, index
        parts.append(part)
        size += len(part) + 1
    if parts:
        yield start, "[" + ",".join(parts) + "]"
