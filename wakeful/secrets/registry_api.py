"""Registries' logins on the control API, admin only (`wakeful.activator.roles`).

PUT    /v1/registries/{host}   {"username": U, "password": P}: the login the control plane
                               pulls `host`'s images with; answers the host and username
DELETE /v1/registries/{host}   the login gone
GET    /v1/registries          hosts, usernames, when and by whom: never a password

The password travels only in the PUT's body, never in a URL, and no answer holds it. The body
is read and checked here (`registries.read_login`), not by FastAPI, whose validation errors
quote what they refuse; so is the host, for a refusal that names the field.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from wakeful.domain.models import MAX_PASSWORD_BYTES

from .errors import ChangeRefused, KeysUnusable, SealError
from .registries import LoginEntry, RegistryBook, read_login, registry_host

MAX_BODY = 8 * MAX_PASSWORD_BYTES
"""A login's body: the password, however JSON escapes it, and a username."""
STATUS = {"invalid": 422, "unknown": 404, "conflict": 409}


class LoginBody(BaseModel):
    """The PUT's body (for the schema; `registries.read_login` reads it)."""

    model_config = ConfigDict(extra="forbid")
    username: str
    password: str = Field(max_length=MAX_PASSWORD_BYTES)


class RegistryEntry(BaseModel):
    host: str
    username: str
    set_at: float
    set_by: str
    key_id: str
    """The secrets key its password is sealed under (never the password)."""


class LoginReport(RegistryEntry):
    changed: bool
    """False when the login was already so: nothing written."""


class LoggedOut(BaseModel):
    host: str


def _entry(entry: LoginEntry) -> dict[str, Any]:
    return {
        "host": entry.host,
        "username": entry.username,
        "set_at": entry.set_at,
        "set_by": entry.set_by,
        "key_id": entry.key_id,
    }


def registries_router(book: RegistryBook) -> APIRouter:
    router = APIRouter()

    def bad(status: int, error: str, detail: str) -> HTTPException:
        return HTTPException(status, {"error": error, "detail": detail})

    def refused(exc: ChangeRefused) -> HTTPException:
        error = {"invalid": "invalid login", "unknown": "unknown", "conflict": "refused"}
        return bad(STATUS[exc.kind], error[exc.kind], str(exc))

    async def body_of(request: Request) -> object:
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise bad(413, "body too large", f"a login is at most {MAX_BODY} bytes")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):  # says nothing of what it held
            raise bad(422, "invalid login", "the body is not JSON") from None

    schema = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": LoginBody.model_json_schema()}},
        }
    }

    @router.put("/v1/registries/{host}", response_model=LoginReport, openapi_extra=schema)
    async def login(host: str, request: Request) -> LoginReport:
        """The login `host`'s images are pulled with, replacing any (nothing is written when
        the host or the body is refused)."""
        try:
            host = registry_host(host)  # the host first: a bad one is named before the body
            wanted = read_login(await body_of(request))
            done = await book.login(host, wanted, by=request.state.token.name)
        except ChangeRefused as exc:
            raise refused(exc) from None
        except (SealError, KeysUnusable) as exc:
            raise HTTPException(
                503,
                {"error": "secrets unavailable", "detail": str(exc)},
                headers={"Retry-After": "5"},
            ) from None
        return LoginReport(**_entry(done), changed=done.changed)

    @router.delete("/v1/registries/{host}", response_model=LoggedOut)
    async def logout(host: str) -> LoggedOut:
        try:
            return LoggedOut(host=await book.logout(host))
        except ChangeRefused as exc:
            raise refused(exc) from None

    @router.get("/v1/registries", response_model=list[RegistryEntry])
    async def listing() -> list[RegistryEntry]:
        return [RegistryEntry(**_entry(entry)) for entry in await book.listing()]

    return router
