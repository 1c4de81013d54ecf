"""Role tokens through the control API (admin only, see `wakeful.activator.roles`).

GET    /v1/tokens               every token: name, role, id, when made and rotated; never a
                                secret, never a digest
POST   /v1/tokens               {name, role}: a new token; the answer carries its secret, the
                                only time it is shown
POST   /v1/tokens/{name}/rotate a new secret for the token; the old one is refused from the
                                answer on. For `admin`, with `write_admin` set (`wakeful up`),
                                the secret goes to the data directory's token file instead
DELETE /v1/tokens/{name}        revoke: the secret is refused from the answer on
GET    /v1/whoami               any role: the calling token's name and role (a piece apart
                                checks its token with it at its start)

Each write answers once this control plane's `TokenBook` has applied it (`caught_up`, bounded
by `WAIT`): when the CLI returns, a revoked secret is already refused here.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
import logging
import time
from collections.abc import Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from wakeful.activator.credentials import new_secret
from wakeful.domain import keys
from wakeful.domain.models import ADMIN_TOKEN, NAME_PATTERN, UP_INGRESS_TOKEN, Role, Token
from wakeful.store import AlreadyExists, Conflict, Delete, Require, Store
from wakeful.store.tokenbook import TokenBook, digest, new_id

TokenName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="a token's name")]
WAIT = 10.0
"""Seconds a write waits for the control plane's own view to apply it."""
log = logging.getLogger(__name__)


_UP_INGRESS = (
    f"{UP_INGRESS_TOKEN!r} is the token `wakeful up` makes at each start for its ingress "
    "workers: it cannot be made or rotated here (revoking it cuts running workers off)"
)


class Caller(BaseModel):
    """Who a token is: its name and role (`GET /v1/whoami`)."""

    name: str
    role: Role


class Revoked(BaseModel):
    name: str
    effective: bool


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN, description="a DNS label, e.g. the node's name")
    role: Role


class TokenReport(BaseModel):
    name: str
    role: Role
    id: str
    created_at: float
    rotated_at: float | None

    @classmethod
    def of(cls, token: Token) -> "TokenReport":
        return cls(
            name=token.name,
            role=token.role,
            id=token.id,
            created_at=token.created_at,
            rotated_at=token.rotated_at,
        )


class IssuedToken(TokenReport):
    secret: str | None = None
    """The secret, shown this once; None when it was written to `written_to` instead."""
    written_to: str | None = None
    effective: bool = True
    """False when this control plane had not applied the write within `WAIT` seconds."""


def tokens_router(
    store: Store,
    book: TokenBook,
    *,
    write_admin: Callable[[str], str] | None = None,
    clock: Callable[[], float] = time.time,
) -> APIRouter:
    """`write_admin`: keeps a new admin secret where the control plane's own user finds it
    (`wakeful up`: the token file), returning where; None to hand it back in the answer."""
    router = APIRouter()

    def bad(status: int, error: str, detail: str) -> HTTPException:
        return HTTPException(status, {"error": error, "detail": detail})

    async def applied(revision: int) -> bool:
        with anyio.move_on_after(WAIT):
            await book.caught_up(revision)
            return True
        return False

    @router.get("/v1/whoami", response_model=Caller)
    async def whoami(request: Request) -> Caller:
        token = request.state.token
        return Caller(name=token.name, role=token.role)

    @router.get("/v1/tokens", response_model=list[TokenReport])
    async def listing() -> list[TokenReport]:
        found = (await store.list(keys.TOKENS, Token)).items
        return [TokenReport.of(item.value) for item in found]

    @router.post("/v1/tokens", status_code=201, response_model=IssuedToken)
    async def create(body: TokenRequest) -> IssuedToken:
        if body.name == ADMIN_TOKEN:
            raise bad(
                409,
                "reserved name",
                f"{ADMIN_TOKEN!r} is the control plane's own admin token: rotate it with "
                "`wakeful tokens rotate-admin`",
            )
        if body.name == UP_INGRESS_TOKEN:
            raise bad(409, "reserved name", _UP_INGRESS)
        secret = new_secret()
        token = Token(
            name=body.name, role=body.role, id=new_id(), sha256=digest(secret), created_at=clock()
        )
        try:
            revision = await store.create(keys.token(body.name), token)
        except AlreadyExists:
            raise bad(
                409, "token exists", f"a token named {body.name!r} exists: rotate or revoke it"
            ) from None
        report = TokenReport.of(token).model_dump()
        return IssuedToken(**report, secret=secret, effective=await applied(revision))

    @router.post("/v1/tokens/{name}/rotate", response_model=IssuedToken)
    async def rotate(name: TokenName) -> IssuedToken:
        if name == UP_INGRESS_TOKEN:  # its secret is in the workers' environment alone
            raise bad(409, "reserved name", _UP_INGRESS)
        current = await store.get(keys.token(name), Token)
        if current is None:
            raise bad(404, "unknown token", f"no token named {name!r}")
        secret = new_secret()
        token = current.value.model_copy(
            update={"id": new_id(), "sha256": digest(secret), "rotated_at": clock()}
        )
        revision = await store.update(keys.token(name), token, current.revision)
        effective = await applied(revision)
        report = TokenReport.of(token).model_dump()
        if name == ADMIN_TOKEN and write_admin is not None:
            try:
                return IssuedToken(**report, written_to=write_admin(secret), effective=effective)
            except OSError as exc:  # the store has it already: the caller must get the secret
                log.error("could not write the new admin token to its file: %s", exc.strerror)
        return IssuedToken(**report, secret=secret, effective=effective)

    @router.delete("/v1/tokens/{name}", response_model=Revoked)
    async def revoke(name: TokenName) -> Revoked:
        """`effective`: this control plane refuses the secret already (else within seconds)."""
        if name == ADMIN_TOKEN:
            raise bad(
                409,
                "admin token",
                "the admin token cannot be revoked: rotate it with `wakeful tokens rotate-admin`",
            )
        current = await store.get(keys.token(name), Token)
        if current is None:
            raise bad(404, "unknown token", f"no token named {name!r}")
        try:
            revision = await store.txn(
                [Require(current.key, current.revision)], [Delete(current.key)]
            )
        except Conflict:
            raise bad(409, "conflict", f"token {name!r} changed meanwhile, try again") from None
        return Revoked(name=name, effective=await applied(revision))

    return router
