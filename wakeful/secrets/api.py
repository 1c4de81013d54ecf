"""App secrets on the control API (the role of each route: `wakeful.activator.roles`).

POST   /v1/apps/{app}/secrets          admin: {"values": {NAME: VALUE}, "restart": true};
                                       answers names, never a value
POST   /v1/apps/{app}/secrets/unset    admin: {"names": [NAME], "restart": true}
GET    /v1/apps/{app}/secrets          admin: names, when, by which token, under which key
POST   /v1/secrets/keys                admin: a new key, current, every value sealed again
                                       (registries' logins too)
GET    /v1/secrets/keys                admin: key ids, the current one, values under each
DELETE /v1/secrets/keys/{key_id}       admin: retire a key no value is sealed under
GET    /v1/sandboxes/{sandbox_id}/secrets
                                       node: the values for a sandbox the node is starting,
                                       `{"generation": g, "env": {...}}`; an admin token (a
                                       node run with it) gets an empty env for an app with
                                       no secrets, 403 for one with some: nobody reads a
                                       value back with it

Values travel only in the bodies of the set and of the node's GET, never in a URL. Those
bodies are read and checked here (`rules.read_set`), not by FastAPI: its validation errors
quote what they refused, which could be a value. No answer, log line or exception message of
these routes holds a value.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.
import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from wakeful.domain.models import (
    KEY_ID_PATTERN,
    MAX_SECRET_BYTES,
    MAX_SECRETS,
    NAME_PATTERN,
    SANDBOX_ID_PATTERN,
    Role,
)

from .book import SecretBook
from .errors import (
    ChangeRefused,
    KeyRefused,
    KeysUnusable,
    NoSuchKey,
    NotYours,
    SealError,
    UnknownSandbox,
)
from .rules import Change, read_set, read_unset

AppName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="an app name")]
KeyId = Annotated[str, PathParam(pattern=KEY_ID_PATTERN, description="a secrets key's id")]
SandboxId = Annotated[str, PathParam(pattern=SANDBOX_ID_PATTERN, description="a sandbox id")]
MAX_BODY = 4 << 20
"""The largest body a change may have: 512 KiB of values, however JSON escapes them."""
STATUS = {"invalid": 422, "unknown": 404, "conflict": 409}
NO_STORE = {"Cache-Control": "no-store"}


class SetBody(BaseModel):
    """The set's body (for the schema; `rules.read_set` reads it)."""

    model_config = ConfigDict(extra="forbid")
    values: dict[str, Annotated[str, Field(max_length=MAX_SECRET_BYTES)]] = Field(
        max_length=MAX_SECRETS
    )
    restart: bool = True


class UnsetBody(BaseModel):
    """The unset's body (for the schema; `rules.read_unset` reads it)."""

    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(max_length=MAX_SECRETS)
    restart: bool = True


class ChangeReport(BaseModel):
    """What a change did (`book.Changed`, field for field)."""

    app: str
    set: list[str]
    unchanged: list[str]
    unset: list[str]
    generation: int
    restart_generation: int
    restart: bool
    sandboxes: int
    """Sandboxes of the app started before the change, being replaced."""


class SecretEntry(BaseModel):
    name: str
    set_at: float
    set_by: str
    key_id: str


class SecretListing(BaseModel):
    app: str
    generation: int
    restart_generation: int
    secrets: list[SecretEntry]


class KeyEntry(BaseModel):
    id: str
    current: bool
    present: bool
    values: int


class RotationReport(BaseModel):
    id: str
    previous: str
    records: int
    values: int
    logins: int = 0
    """Registries' logins sealed again (`wakeful registry`)."""
    acme: int = 0
    """Keys from ACME (certificates' and the account's) sealed again (`wakeful certs`)."""


class Retired(BaseModel):
    id: str


class SandboxSecrets(BaseModel):
    generation: int
    env: dict[str, str]


def secrets_router(book: SecretBook) -> APIRouter:
    router = APIRouter()

    def bad(status: int, error: str, detail: str) -> HTTPException:
        return HTTPException(status, {"error": error, "detail": detail})

    def refused(exc: ChangeRefused) -> HTTPException:
        error = {"invalid": "invalid secrets", "unknown": "unknown", "conflict": "refused"}
        return bad(STATUS[exc.kind], error[exc.kind], str(exc))

    def unavailable(exc: Exception) -> HTTPException:
        return HTTPException(
            503,
            {"error": "secrets unavailable", "detail": str(exc)},
            headers={"Retry-After": "5"},
        )

    async def body_of(request: Request) -> object:
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise bad(413, "body too large", f"a change of secrets is at most {MAX_BODY} bytes")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):  # quotes nothing, but say less still; nested
            # past the parser's depth (`[[[[...`) is not a body anyone means either
            raise bad(422, "invalid secrets", "the body is not JSON") from None

    def schema(body: type[BaseModel]) -> dict[str, Any]:
        return {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": body.model_json_schema()}},
            }
        }

    async def change(app: str, wanted: Change, request: Request) -> ChangeReport:
        try:
            changed = await book.change(app, wanted, by=request.state.token.name)
        except ChangeRefused as exc:
            raise refused(exc) from None
        except (SealError, KeysUnusable) as exc:
            raise unavailable(exc) from None
        return ChangeReport.model_validate(changed, from_attributes=True)

    @router.post(
        "/v1/apps/{app}/secrets", response_model=ChangeReport, openapi_extra=schema(SetBody)
    )
    async def set_secrets(app: AppName, request: Request) -> ChangeReport:
        """Set every name given, or none (nothing is written when any is refused)."""
        try:
            wanted = read_set(await body_of(request))
        except ChangeRefused as exc:
            raise refused(exc) from None
        return await change(app, wanted, request)

    @router.post(
        "/v1/apps/{app}/secrets/unset",
        response_model=ChangeReport,
        openapi_extra=schema(UnsetBody),
    )
    async def unset_secrets(app: AppName, request: Request) -> ChangeReport:
        """Unset every name given, or none (an unknown name refuses the whole call)."""
        try:
            wanted = read_unset(await body_of(request))
        except ChangeRefused as exc:
            raise refused(exc) from None
        return await change(app, wanted, request)

    @router.get("/v1/apps/{app}/secrets", response_model=SecretListing)
    async def listing(app: AppName) -> SecretListing:
        try:
            listed = await book.listing(app)
        except ChangeRefused as exc:
            raise refused(exc) from None
        return SecretListing(
            app=listed.app,
            generation=listed.generation,
            restart_generation=listed.restart_generation,
            secrets=[
                SecretEntry(name=e.name, set_at=e.set_at, set_by=e.set_by, key_id=e.key_id)
                for e in listed.secrets
            ],
        )

    @router.get("/v1/secrets/keys", response_model=list[KeyEntry])
    async def keys() -> list[KeyEntry]:
        try:
            found = await book.ring.report()
        except KeysUnusable as exc:
            raise unavailable(exc) from None
        return [
            KeyEntry(id=k.id, current=k.current, present=k.present, values=k.values) for k in found
        ]

    @router.post("/v1/secrets/keys", status_code=201, response_model=RotationReport)
    async def rotate() -> RotationReport:
        """A new key, current at once; every value sealed again under it (no restart)."""
        try:
            rotated = await book.rotate_key()
        except KeyRefused as exc:
            raise bad(409, "rotation refused", str(exc)) from None
        except (SealError, KeysUnusable) as exc:
            raise unavailable(exc) from None
        return RotationReport(
            id=rotated.key,
            previous=rotated.previous,
            records=rotated.records,
            values=rotated.values,
            logins=rotated.logins,
            acme=rotated.acme,
        )

    @router.delete("/v1/secrets/keys/{key_id}", response_model=Retired)
    async def retire(key_id: KeyId) -> Retired:
        try:
            await book.ring.retire(key_id)
        except NoSuchKey as exc:
            raise bad(404, "unknown key", str(exc)) from None
        except KeyRefused as exc:
            raise bad(409, "key in use", str(exc)) from None
        return Retired(id=key_id)

    @router.get("/v1/sandboxes/{sandbox_id}/secrets", response_model=SandboxSecrets)
    async def for_sandbox(sandbox_id: SandboxId, request: Request) -> JSONResponse:
        """The values of the app of a sandbox the asking node is starting (its node token
        names it): 403 for any other sandbox, 404 for none."""
        token = request.state.token
        try:
            if token.role is Role.ADMIN:
                found = await book.without_values(sandbox_id)
            else:
                found = await book.env_for(token.name, sandbox_id)
        except NotYours as exc:
            raise bad(403, "forbidden", str(exc)) from None
        except UnknownSandbox as exc:
            raise bad(404, "unknown sandbox", str(exc)) from None
        except (SealError, KeysUnusable) as exc:
            raise unavailable(exc) from None
        body = {"generation": found.generation, "env": found.env}
        return JSONResponse(body, headers=NO_STORE)

    return router
