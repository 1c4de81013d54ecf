"""Logs through the control API (behind its role check, `activator.roles`: a node token may
push, only an admin token may read).

POST /v1/logs                        a node pushes a batch of its sandboxes' output
GET  /v1/apps/{app}/logs             an app's lines: the last `tail` (200), or with `since`
                                     and no `tail` every line from then on, streamed; filtered
                                     by `until`, `grep`, `sandbox`, `version`; `kind=access`
                                     for its access log; `format=json` for JSON Lines as the
                                     log directory holds them, else text (`[sandbox] line`)
GET  /v1/sandboxes/{id}/log?tail=N   the last N lines of one sandbox

Reads come from the log directory (`wakeful.deploy.logread`, on worker threads, at most
`MAX_READS` at once: past that a 503 with Retry-After); the control plane never calls a node.
When a node running the app's sandboxes has not shipped lately, still holds output, or some
output never arrived, the answer says so in the `Wakeful-Logs-Behind` header.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from wakeful.deploy import logread
from wakeful.deploy.logbook import LogBook
from wakeful.domain import keys
from wakeful.domain.logbatch import BEHIND_HEADER, MAX_BODY_BYTES, LogBatch, ShipFailed
from wakeful.domain.logfiles import Kind, line_text, parse_time
from wakeful.domain.models import (
    HAS_PROCESS,
    NAME_PATTERN,
    App,
    Role,
    Sandbox,
    describe_validation_error,
)
from wakeful.store import Store

log = logging.getLogger(__name__)

MAX_TAIL = 10_000
MAX_READS = 4
"""Reads of the log directory at once; each holds a worker thread while it streams."""
MAX_NOTES = 20
"""Notes in a `Wakeful-Logs-Behind` header; past them, how many more."""
SEND_TIMEOUT = 30.0
"""Seconds a streamed read waits for its client to take a piece before it cuts it off."""
CHUNK = 64 * 1024
"""Bytes of lines sent in one piece of a streamed answer."""
SANDBOX_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
Tail = Annotated[int | None, Query(ge=1, le=MAX_TAIL, description="the last N lines")]


def _bad(status: int, error: str, detail: str) -> HTTPException:
    return HTTPException(status, {"error": error, "detail": detail})


async def own_output(store: Store, batch: LogBatch, node: str) -> LogBatch:
    """A node token (named after its node) pushes only its node's batch, and only the output
    of sandboxes recorded on that node for the app they say: a node cannot silence, evict or
    forge another's logs. Chunks of a sandbox whose record is gone are dropped."""
    if batch.node != node:
        raise _bad(
            403,
            "forbidden",
            f"this node token is {node!r}'s; it cannot push node {batch.node!r}'s output",
        )
    kept = []
    for chunk in batch.chunks:
        record = await store.get(keys.sandbox(chunk.sandbox), Sandbox)
        if record is not None and record.value.node == node and record.value.app == chunk.app:
            kept.append(chunk)
    return batch.model_copy(update={"chunks": kept})


def logs_router(store: Store, logbook: LogBook) -> APIRouter:
    router = APIRouter()
    too_large = _bad(413, "batch too large", f"the bound is {MAX_BODY_BYTES} bytes")
    reads = threading.BoundedSemaphore(MAX_READS)
    root = logbook.logdir.root

    @router.post("/v1/logs", status_code=204)
    async def receive(request: Request) -> Response:
        """A node's batch, read within a bound: a node cannot make the control plane buffer
        more than `MAX_BODY_BYTES` per request. Answered once its lines are on disk."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise too_large
        try:
            batch = LogBatch.model_validate_json(bytes(body))
        except ValidationError as exc:
            raise _bad(422, "invalid request", describe_validation_error(exc)[:500]) from exc
        token = getattr(request.state, "token", None)
        if token is not None and token.role is Role.NODE:
            batch = await own_output(store, batch, token.name)
        try:
            await logbook.ship(batch)
        except ShipFailed as exc:
            raise HTTPException(
                503, {"error": "unavailable", "detail": str(exc)}, {"Retry-After": "2"}
            ) from exc
        return Response(status_code=204)

    @router.get("/v1/apps/{app}/logs")
    async def app_logs(
        app: str,
        tail: Tail = None,
        since: str | None = None,
        until: str | None = None,
        grep: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
        sandbox: str | None = None,
        version: str | None = None,
        kind: Literal["output", "access"] = "output",
        format: Literal["text", "json"] = "text",
    ) -> Response:
        if not re.fullmatch(NAME_PATTERN, app):
            raise _bad(422, "invalid request", f"app: not an app name (got {app!r})")
        if sandbox is not None and not SANDBOX_ID.fullmatch(sandbox):
            raise _bad(422, "invalid request", f"sandbox: not a sandbox id (got {sandbox!r})")
        if version is not None and not re.fullmatch(NAME_PATTERN, version):
            raise _bad(422, "invalid request", f"version: not a version (got {version!r})")
        now = logbook.now()
        query = logread.Query(
            _time("since", since, now), _time("until", until, now), grep, sandbox, version
        )
        known = await store.get(keys.app(app), App) is not None
        if not known and not await anyio.to_thread.run_sync(logread.has_logs, root, app):
            raise _bad(404, "unknown app", f"no app named {app!r}")
        headers = {}
        if kind == "output":
            notes = logbook.behind(app, await _nodes_of(store, app), now)
            if notes:  # a header of bounded length, however many sandboxes miss bytes
                more = len(notes) - MAX_NOTES
                notes = notes[:MAX_NOTES] + ([f"and {more} more"] if more > 0 else [])
                headers[BEHIND_HEADER] = "; ".join(notes)
        taken(reads)
        media = "application/x-ndjson" if format == "json" else "text/plain; charset=utf-8"
        shape = _raw if format == "json" else _as_text(kind)
        if tail is not None or query.since is None:
            try:
                found = await anyio.to_thread.run_sync(
                    logread.tail, root, app, kind, query, tail or 200
                )
            finally:
                reads.release()
            return Response(b"".join(shape(line) for line in found), 200, headers, media)
        lines = logread.forward(root, app, kind, query)
        return _Streamed(_pieces(lines, shape), reads.release, headers, media)

    @router.get("/v1/sandboxes/{sandbox_id}/log")
    async def sandbox_log(sandbox_id: str, tail: Tail = None) -> Response:
        if not SANDBOX_ID.fullmatch(sandbox_id):
            raise _bad(422, "invalid request", f"sandbox: not a sandbox id (got {sandbox_id!r})")
        app = logbook.app_of(sandbox_id)
        if app is None:
            record = await store.get(keys.sandbox(sandbox_id), Sandbox)
            if record is None:
                raise _bad(404, "unknown sandbox", f"no sandbox {sandbox_id!r}")
            app = record.value.app
        query = logread.Query(sandbox=sandbox_id)
        taken(reads)
        try:
            found = await anyio.to_thread.run_sync(
                logread.tail, root, app, "output", query, tail or 200
            )
        finally:
            reads.release()
        return Response(b"".join(_line_only(line) for line in found), media_type="text/plain")

    return router


def taken(reads: threading.BoundedSemaphore) -> None:
    """One of the read slots, or 503 + Retry-After when every one is taken."""
    if not reads.acquire(blocking=False):
        raise HTTPException(
            503,
            {"error": "busy", "detail": f"{MAX_READS} log reads are running; try again"},
            {"Retry-After": "1"},
        )


def _time(field: str, value: str | None, now: float) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value, now)
    except ValueError as exc:
        raise _bad(422, "invalid request", f"{field}: {exc}") from exc


async def _nodes_of(store: Store, app: str) -> set[str]:
    sandboxes = (await store.list(keys.SANDBOXES, Sandbox)).items
    return {
        s.value.node
        for s in sandboxes
        if s.value.app == app and s.value.status in HAS_PROCESS and s.value.node
    }


def _raw(line: bytes) -> bytes:
    return line


def _as_text(kind: Kind) -> Callable[[bytes], bytes]:
    def shape(line: bytes) -> bytes:
        try:
            record = json.loads(line)
        except ValueError:
            return b""
        return line_text(record, kind).encode() + b"\n"

    return shape


def _line_only(line: bytes) -> bytes:
    try:
        record = json.loads(line)
    except ValueError:
        return b""
    text = record.get("line", record.get("wakeful", ""))
    return f"{text}\n".encode()


class _Streamed(StreamingResponse):
    """A streamed read that gives its slot back however it ends: also when its client left
    before the first byte (Starlette then never starts the body's generator, whose own
    `finally` would never run), and when its client stops reading (cut off after
    `SEND_TIMEOUT` without taking a piece)."""

    def __init__(
        self,
        content: Iterator[bytes],
        done: Callable[[], None],
        headers: dict[str, str],
        media: str,
    ) -> None:
        super().__init__(content, 200, headers, media)
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed(message: Message) -> None:
            with anyio.fail_after(SEND_TIMEOUT):  # a client that reads nothing lets go
                await send(message)

        try:
            await super().__call__(scope, receive, timed)
        except TimeoutError:
            log.info("a log read's client read nothing for %g s; cut off", SEND_TIMEOUT)
        finally:
            self._done()


def _pieces(lines: Iterator[bytes], shape: Callable[[bytes], bytes]) -> Iterator[bytes]:
    """`lines` shaped, in pieces of about `CHUNK` bytes (a worker thread runs each step)."""
    piece = bytearray()
    for line in lines:
        piece += shape(line)
        if len(piece) >= CHUNK:
            yield bytes(piece)
            piece.clear()
    if piece:
        yield bytes(piece)
