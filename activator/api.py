"""The control API: the lease protocol and pool state, plus the routers mounted on it, behind
role-scoped bearer tokens.

Every route is checked by one dependency of the whole app (`authorize`): the route's decision
in `wakeful.activator.roles.ROUTES` (admin-only when it has none), then the token's role from
the `TokenBook`. No token or an unknown one is a 401; a token of another role a 403 that
names the role needed. Errors are `{"error": ..., "detail": ...}` with a one-line reason;
503s carry Retry-After. `/healthz`, `/readyz` and `/metrics` need no token (they reveal no app data
beyond pool names); `/openapi.json` needs a token of any role.
"""

# No `from __future__ import annotations` here: FastAPI reads the dependency annotations at
# runtime, and they name a local (the bearer scheme).
import collections
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any

import anyio
import fastapi.routing
from fastapi import (
    APIRouter,
    Depends,
    FastAPI,
    HTTPException,
    Request,
    Response,
    WebSocket,
    WebSocketException,
)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, APIWebSocketRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field
from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute, Host, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from wakeful.activator.channel import MAX_CHANNELS_PER_TOKEN, POLICY_VIOLATION, Channel
from wakeful.activator.channel import PATH as CHANNEL_PATH
from wakeful.activator.core import Activator
from wakeful.activator.lease_errors import FORBIDDEN, INVALID_REQUEST, UNAUTHORIZED, to_wire
from wakeful.activator.ledger import Lease
from wakeful.activator.reporting import PoolSnapshot
from wakeful.activator.roles import (
    ADMIN_ONLY,
    PUBLIC,
    SESSION,
    WEBSOCKET,
    Access,
    access,
    needed,
)
from wakeful.aio.marks import Marks
from wakeful.domain.leases import MAX_ASK_REQUESTS, ActivatorError, LeaseGrant, Riders
from wakeful.domain.models import NAME_PATTERN, Role
from wakeful.store import Conflict, InvalidKey, StoreError
from wakeful.store.tokenbook import TokenBook


class LeaseRequest(BaseModel):
    app: str = Field(pattern=NAME_PATTERN, description="the app to route to")
    version: str | None = Field(default=None, pattern=NAME_PATTERN)
    requests: int = Field(
        default=1,
        ge=1,
        le=MAX_ASK_REQUESTS,
        description="requests waiting on this ask: a parked ask counts as that many (at most "
        "one lease's size)",
    )


class RenewRequest(BaseModel):
    used: bool = Field(default=False, description="the lease carried traffic since last renew")


def _error(
    status: int, error: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def _wire_answer(exc: ActivatorError | StoreError) -> Response:
    """A lease API error, as `activator/lease_errors.py` has it over HTTP."""
    wire = to_wire(exc)
    return JSONResponse(wire.body(), status_code=wire.status, headers=wire.headers())


def create_app(
    activator: Activator,
    tokens: TokenBook,
    registry: CollectorRegistry,
    routers: Sequence[APIRouter] = (),
    max_channels: int = MAX_CHANNELS_PER_TOKEN,
    routes_seen: Marks | None = None,
) -> FastAPI:
    """The control API: leases and pools, plus `routers` (deploys, nodes, logs, tokens), each
    route open to the roles `wakeful.activator.roles` names for it. `max_channels`: lease
    channels one token may hold open at once. `routes_seen`: where the lease channels keep
    how far each ingress's routes have come (a deploy waits on it)."""
    seen = Marks() if routes_seen is None else routes_seen
    bearer = _Bearer(auto_error=False)

    async def authorize(
        request: HTTPConnection,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        # The route this request matched, decided once below (unknown: admin-only). A
        # WebSocket's handshake has no method of its own: its routes are keyed "WEBSOCKET".
        method = request.scope.get("method", WEBSOCKET)
        path, allowed = decisions.get(
            (id(request.scope.get("route")), method), (request.url.path, ADMIN_ONLY)
        )
        if not isinstance(allowed, frozenset):  # PUBLIC, or SESSION (the route checks)
            return
        # `TokenGate` verified the token before the body was read and left it in the request's
        # state (who is calling, also for routes that narrow by identity); `credentials` only
        # puts the bearer scheme in the schema.
        token = getattr(request.state, "token", None)
        if credentials is None or token is None:
            raise _Unauthorized()
        if token.role not in allowed:
            if method == WEBSOCKET:  # refused before the handshake completes: an HTTP 403
                raise WebSocketException(POLICY_VIOLATION, f"{path} needs {needed(allowed)}")
            raise _Forbidden(f"{method} {path}", allowed, token.role)

    # No Swagger UI or ReDoc pages (scripts from a CDN, nothing the CLI needs). The schema is
    # served below as a route of our own, so the role check covers it too.
    api = FastAPI(
        title="wakeful control API",
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(authorize)],
    )

    @api.exception_handler(_Unauthorized)
    async def _unauthorized(request: Request, exc: _Unauthorized) -> Response:
        return _error(
            401, UNAUTHORIZED, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"}
        )

    @api.exception_handler(_Forbidden)
    async def _forbidden(request: Request, exc: _Forbidden) -> Response:
        return _error(
            403,
            FORBIDDEN,
            f"{exc.route} needs {needed(exc.allowed)}; this token has the {exc.role} role",
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
        return _error(422, INVALID_REQUEST, "; ".join(reasons))

    @api.exception_handler(ActivatorError)
    async def _activator_error(request: Request, exc: ActivatorError) -> Response:
        return _wire_answer(exc)

    @api.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> Response:
        """A route that meets a store error answers for it; it never becomes a 500 page. A
        bad key and a lost race are the answers of the routes that write (deploys, tokens);
        the rest is the lease API's `store unavailable`."""
        if isinstance(exc, InvalidKey):
            return _error(422, INVALID_REQUEST, str(exc))
        if isinstance(exc, Conflict):
            return _error(409, "conflict", f"changed concurrently, try again: {exc}")
        return _wire_answer(exc)

    open_channels: collections.Counter[str] = collections.Counter()
    """Lease channels open, by the name of the token that opened them."""

    @api.post("/v1/leases", response_model=LeaseGrant)
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
                lease = await activator.acquire(
                    body.app, body.version, riders=Riders(body.requests)
                )
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

    @api.post("/v1/leases/{lease_id}/renew", response_model=LeaseGrant)
    async def renew(lease_id: str, body: RenewRequest | None = None) -> LeaseGrant:
        return activator.renew_grant(lease_id, used=body is not None and body.used)

    @api.delete("/v1/leases/{lease_id}", status_code=204)
    async def release(lease_id: str) -> Response:
        activator.release(lease_id)
        return Response(status_code=204)

    @api.websocket(CHANNEL_PATH)
    async def lease_channel(websocket: WebSocket) -> None:
        """The lease protocol for an ingress, many calls in flight (activator/channel.py)."""
        secret = _bearer(websocket.headers.get("authorization", "").encode("latin-1")) or ""
        token = tokens.verify(secret)  # the gate let it through: a token, or the admin secret
        holder = token.name if token is not None else ""

        def allowed() -> bool:
            return tokens.verify(secret) is not None

        channel = Channel(websocket, activator, seen, allowed, scope=f"token:{holder}")
        if open_channels[holder] >= max_channels:
            await channel.refuse(f"more than {max_channels} lease channels open on this token")
            return
        open_channels[holder] += 1
        try:
            await channel.serve()
        finally:
            open_channels[holder] -= 1
            if not open_channels[holder]:
                del open_channels[holder]

    @api.get("/v1/pools", response_model=list[PoolSnapshot])
    async def pools() -> list[PoolSnapshot]:
        return activator.snapshot()

    for router in routers:
        api.include_router(router)

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.head("/healthz", include_in_schema=False)  # load balancers' health checks
    async def healthz_head() -> Response:
        return Response(status_code=200)

    @api.get("/readyz")
    async def readyz() -> dict[str, str]:
        """200 on the activator that leads (a standby answers 503: `standby.py`), so a load
        balancer in front of several sends control traffic to the leader only."""
        return {"status": "leading"}

    @api.get("/openapi.json", include_in_schema=False)
    async def schema() -> dict[str, Any]:
        return api.openapi()

    @api.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    decisions: dict[tuple[int, str], tuple[str, Access]] = {}
    for method, path, route in served_routes(api):
        decided = access(method, path)
        # The app's dependency runs for FastAPI's own routes only; any other (the schema)
        # must be public, or it would be served to anyone whatever the map says.
        if not isinstance(route, APIRoute | APIWebSocketRoute) and decided not in (
            PUBLIC,
            SESSION,
        ):
            raise RuntimeError(f"{method} {path} would be served without the role check")
        earlier = decisions.get((id(route), method))
        if earlier is not None and earlier[1] != decided:  # one router included twice
            raise RuntimeError(f"{method} {path} and {earlier[0]} share a route object")
        decisions[(id(route), method)] = (path, decided)
    for entry in _entries(api):
        if isinstance(entry, Mount | Host):  # a mounted app never sees the dependency
            raise RuntimeError(f"{entry!r}: a mount would be served without the role check")
    # The bearer gate lets public and session routes through (a session route checks its
    # cookie itself); `authorize` below returns for both.
    public = frozenset(path for path, decided in decisions.values() if decided in (PUBLIC, SESSION))
    sockets = {
        path: decided
        for (_, method), (path, decided) in decisions.items()
        if method == WEBSOCKET and isinstance(decided, frozenset)
    }
    api.add_middleware(TokenGate, tokens=tokens, public=public, sockets=sockets)
    return api


class _Bearer(HTTPBearer):
    """FastAPI's bearer scheme (it puts the scheme in the schema), for WebSocket routes too:
    FastAPI gives a WebSocket's dependencies an `HTTPConnection`, never a `Request`."""

    async def __call__(self, request: HTTPConnection) -> HTTPAuthorizationCredentials | None:
        secret = _bearer(request.headers.get("authorization", "").encode("latin-1"))
        if secret is None:
            return None
        return HTTPAuthorizationCredentials(scheme="Bearer", credentials=secret)


class TokenGate:
    """Refuses a request without a valid token before anything reads its body: FastAPI
    parses a body before it runs dependencies, so `authorize` alone would let anyone make
    the control plane buffer and parse megabytes. The role check stays in `authorize`, except
    for WebSocket routes (`sockets`: path -> roles), refused here with the same 401 and 403
    answers as any route (an HTTP answer to the handshake), where a dependency can only close."""

    def __init__(
        self,
        app: ASGIApp,
        tokens: TokenBook,
        public: frozenset[str],
        sockets: Mapping[str, frozenset[Role]],
    ) -> None:
        self._app = app
        self._tokens = tokens
        self._public = public
        self._sockets = sockets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self._public:
            await self._app(scope, receive, send)
            return
        secret = _bearer(dict(scope["headers"]).get(b"authorization", b""))
        token = None if secret is None else self._tokens.verify(secret)
        allowed = self._sockets.get(scope["path"], ADMIN_ONLY)
        if token is not None and scope["type"] == "websocket" and token.role not in allowed:
            route = f"{WEBSOCKET} {scope['path']}"
            detail = f"{route} needs {needed(allowed)}; this token has the {token.role} role"
            await _error(403, FORBIDDEN, detail)(scope, receive, send)
            return
        if token is None:
            response = _error(
                401,
                UNAUTHORIZED,
                "a valid bearer token is required",
                {"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["token"] = token  # `authorize` reads it: verified once
        await self._app(scope, receive, send)


def _bearer(header: bytes) -> str | None:
    scheme, _, value = header.decode("latin-1").partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def served_routes(api: FastAPI) -> Iterator[tuple[str, str, BaseRoute]]:
    """(method, path, route) for every route `api` serves, where `route` is what a request's
    scope names (`scope["route"]`). Newer FastAPI keeps an included router as one entry of
    `api.routes`; its `iter_route_contexts` opens them."""
    for shown, original in _contexts(api):
        if isinstance(original, APIWebSocketRoute):
            yield WEBSOCKET, str(getattr(shown, "path", "")), original
        for method in sorted(getattr(shown, "methods", None) or ()):
            yield str(method), str(getattr(shown, "path", "")), original


def _contexts(api: FastAPI) -> list[tuple[Any, BaseRoute]]:
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if contexts is None:
        return [(route, route) for route in api.routes]
    return [(context, context.original_route) for context in contexts(api.routes)]


def _entries(api: FastAPI) -> list[BaseRoute]:
    """Every route object `api` serves, routers opened, mounts included."""
    return [original for _, original in _contexts(api)]


class _Unauthorized(Exception):
    pass


class _Forbidden(Exception):
    def __init__(self, route: str, allowed: frozenset[Role], role: Role) -> None:
        super().__init__(route)
        self.route = route
        self.allowed = allowed
        self.role = role
