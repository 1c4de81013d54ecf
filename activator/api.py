"""The activator's HTTP API: the lease protocol and pool state, behind a bearer token.

Errors are `{"error": ..., "detail": ...}` with a one-line reason; 503s carry Retry-After.
`/healthz` and `/metrics` need no token (they reveal no app data beyond pool names).
"""

# No `from __future__ import annotations` here: FastAPI reads the dependency annotations at
# runtime, and they name a local (the bearer scheme).
import secrets
from collections.abc import Mapping, Sequence
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from wakeful.activator.core import Activator, PoolSnapshot
from wakeful.activator.ledger import Lease
from wakeful.domain.leases import (
    ActivatorError,
    AppFailedToBoot,
    LeaseGone,
    LeaseGrant,
    Unavailable,
    UnknownApp,
)
from wakeful.domain.models import NAME_PATTERN
from wakeful.store import Conflict, InvalidKey, StoreError


class LeaseRequest(BaseModel):
    app: str = Field(pattern=NAME_PATTERN, description="the app to route to")
    version: str | None = Field(default=None, pattern=NAME_PATTERN)


class RenewRequest(BaseModel):
    used: bool = Field(default=False, description="the lease carried traffic since last renew")


def _error(
    status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def create_app(
    activator: Activator,
    token: str,
    registry: CollectorRegistry,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The control API: leases and pools, plus `routers` (deploys) behind the same token."""
    if not token:
        raise ValueError("the activator API needs a bearer token (WAKEFUL_TOKEN)")
    bearer = HTTPBearer(auto_error=False)

    async def authorized(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if credentials is None or not secrets.compare_digest(
            credentials.credentials.encode(), token.encode()
        ):
            raise _Unauthorized()

    api = FastAPI(title="wakeful activator", version="1")
    guarded = [Depends(authorized)]

    @api.exception_handler(_Unauthorized)
    async def _unauthorized(request: Request, exc: _Unauthorized) -> Response:
        return _error(
            401, "unauthorized", "a valid bearer token is required", {"WWW-Authenticate": "Bearer"}
        )

    @api.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if isinstance(exc.detail, dict) and "error" in exc.detail:
            return JSONResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
        return _error(exc.status_code, "error", str(exc.detail), exc.headers)

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        reasons = []
        for problem in exc.errors():
            where = ".".join(str(part) for part in problem["loc"])
            got = problem.get("input")
            shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
            reasons.append(f"{where}: {problem['msg']}{shown}")
        return _error(422, "invalid request", "; ".join(reasons))

    @api.exception_handler(ActivatorError)
    async def _activator_error(request: Request, exc: ActivatorError) -> Response:
        if isinstance(exc, UnknownApp):
            return _error(404, "unknown app", str(exc))
        if isinstance(exc, LeaseGone):
            return _error(404, "lease gone", str(exc))
        if isinstance(exc, AppFailedToBoot):
            return JSONResponse(
                {"error": "app failed to boot", "detail": str(exc), "log": exc.log},
                status_code=503,
                headers={"Retry-After": str(exc.retry_after)},
            )
        if isinstance(exc, Unavailable):
            return _error(503, "no capacity", str(exc), {"Retry-After": str(exc.retry_after)})
        return _error(500, "activator error", str(exc))

    @api.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> Response:
        """A route that meets a store error answers for it; it never becomes a 500 page."""
        if isinstance(exc, InvalidKey):
            return _error(422, "invalid request", str(exc))
        if isinstance(exc, Conflict):
            return _error(409, "conflict", f"changed concurrently, try again: {exc}")
        return _error(503, "store unavailable", str(exc), {"Retry-After": "1"})

    @api.post("/v1/leases", dependencies=guarded, response_model=LeaseGrant)
    async def acquire(body: LeaseRequest, request: Request) -> Response:
        """A client that hangs up while waiting leaves the waiter list at once: a parked
        waiter nobody will use would inflate demand and fill the queue (seed 001)."""
        lease: Lease | None = None
        failure: ActivatorError | None = None
        gone = False
        async with anyio.create_task_group() as tasks:

            async def until_disconnect() -> None:
                nonlocal gone
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                gone = True
                tasks.cancel_scope.cancel()

            tasks.start_soon(until_disconnect)
            try:
                lease = await activator.acquire(body.app, body.version)
            except ActivatorError as exc:
                failure = exc  # raised outside the task group, to reach the error handler
            tasks.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if gone or lease is None:  # the client left; nobody will read an answer
            if lease is not None:  # granted in the same step it left: hand it straight back
                activator.release(lease.lease_id)
            return Response(status_code=499)
        return JSONResponse(lease.grant().model_dump(mode="json"))

    @api.post("/v1/leases/{lease_id}/renew", dependencies=guarded, response_model=LeaseGrant)
    async def renew(lease_id: str, body: RenewRequest | None = None) -> LeaseGrant:
        return activator.renew(lease_id, used=body is not None and body.used).grant()

    @api.delete("/v1/leases/{lease_id}", dependencies=guarded, status_code=204)
    async def release(lease_id: str) -> Response:
        activator.release(lease_id)
        return Response(status_code=204)

    @api.get("/v1/pools", dependencies=guarded, response_model=list[PoolSnapshot])
    async def pools() -> list[PoolSnapshot]:
        return activator.snapshot()

    for router in routers:
        api.include_router(router, dependencies=guarded)

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return api


class _Unauthorized(Exception):
    pass
