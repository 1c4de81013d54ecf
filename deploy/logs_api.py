"""Sandbox output through the control API (behind its role check, `activator.roles`: a node
token may push, only an admin token may read).

POST /v1/logs                        a node pushes a batch of its sandboxes' output
GET  /v1/apps/{app}/logs?tail=N      the last N lines of each of the app's sandboxes
GET  /v1/sandboxes/{id}/log?tail=N   the last N lines of one sandbox

Reads come from the control plane's `LogBook`; the control plane never calls a node. When a
node running the app's sandboxes has not shipped lately, still holds output, or some output
never arrived, the answer says so in the `Wakeful-Logs-Behind` header.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
import re
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import ValidationError

from wakeful.deploy.logbook import LogBook
from wakeful.domain import keys
from wakeful.domain.logbatch import BEHIND_HEADER, MAX_BODY_BYTES, LogBatch
from wakeful.domain.models import (
    HAS_PROCESS,
    NAME_PATTERN,
    App,
    Role,
    Sandbox,
    describe_validation_error,
)
from wakeful.store import Store

MAX_TAIL = 10_000
SANDBOX_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
Tail = Annotated[int, Query(ge=1, le=MAX_TAIL, description="lines per sandbox")]


def _bad(status: int, error: str, detail: str) -> HTTPException:
    return HTTPException(status, {"error": error, "detail": detail})


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + ("\n" if lines else "")


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

    @router.post("/v1/logs", status_code=204)
    async def receive(request: Request) -> Response:
        """A node's batch, read within a bound: a node cannot make the control plane buffer
        more than `MAX_BODY_BYTES` per request."""
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
        await logbook.ship(batch)
        return Response(status_code=204)

    @router.get("/v1/apps/{app}/logs")
    async def app_logs(app: str, tail: Tail = 200) -> Response:
        if not re.fullmatch(NAME_PATTERN, app):
            raise _bad(422, "invalid request", f"app: not an app name (got {app!r})")
        if await store.get(keys.app(app), App) is None:
            raise _bad(404, "unknown app", f"no app named {app!r}")
        sandboxes = (await store.list(keys.SANDBOXES, Sandbox)).items
        nodes = {
            s.value.node
            for s in sandboxes
            if s.value.app == app and s.value.status in HAS_PROCESS and s.value.node
        }
        notes = logbook.behind(app, nodes, logbook.now())
        headers = {BEHIND_HEADER: "; ".join(notes)} if notes else None
        return Response(
            _text(logbook.app_lines(app, tail)), media_type="text/plain", headers=headers
        )

    @router.get("/v1/sandboxes/{sandbox_id}/log")
    async def sandbox_log(sandbox_id: str, tail: Tail = 200) -> Response:
        if not SANDBOX_ID.fullmatch(sandbox_id):
            raise _bad(422, "invalid request", f"sandbox: not a sandbox id (got {sandbox_id!r})")
        if not logbook.knows(sandbox_id) and (
            await store.get(keys.sandbox(sandbox_id), Sandbox) is None
        ):
            raise _bad(404, "unknown sandbox", f"no sandbox {sandbox_id!r}")
        return Response(_text(logbook.sandbox_lines(sandbox_id, tail)), media_type="text/plain")

    return router
