"""The deploy half of the control API: artifacts, deploys, rollbacks and apps.

Mounted behind the role check of the control API (`activator.api.create_app`; the decisions
are in `activator.roles`): every route here is admin-only except `GET /v1/artifacts/{digest}`
and `PUT /v1/states/{digest}` (a stateful app's archive), which a node token may call too.
Sandbox output is served by `deploy.logs_api`.
"""

from typing import Annotated

import anyio
import anyio.abc
from fastapi import APIRouter, HTTPException, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel

from wakeful.deploy.appdir import AppDefinition
from wakeful.deploy.artifacts import ArtifactStorageError, LocalArtifacts
from wakeful.deploy.service import Deployer, DeployError, Phase, UnknownApp
from wakeful.domain import keys
from wakeful.domain.artifacts import ArtifactError
from wakeful.domain.models import NAME_PATTERN, App, Version
from wakeful.store import Store

# Names from a URL are checked before they become store keys: a malformed one is a 422 that
# names the value, never a store error.
AppName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="an app name")]
VersionName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="a version, e.g. v3")]
Digest = Annotated[str, PathParam(pattern=r"^[0-9a-f]{64}$", description="a sha256, hex")]


class DeployRequest(BaseModel):
    definition: AppDefinition
    artifact: str | None = None


class RolloutReport(BaseModel):
    app: str
    version: str
    pool: str
    phase: Phase
    message: str
    ready: int
    target_ready: int


class DeletionReport(BaseModel):
    app: str
    versions: int
    pools: list[str]
    """Retired: their sandboxes drain (requests on them finish), then the pools go."""
    artifacts_removed: int
    """Deleted by the artifact collection run after the deletion: unreferenced artifacts
    uploaded more than the grace period ago (a newer one goes in a later run)."""


class AppReport(BaseModel):
    name: str
    hosts: list[str]
    default_host: bool
    active_version: str | None
    previous_version: str | None
    versions: list[str]


UPLOADS = 4
"""Uploads (artifacts and state archives) received at once."""
UPLOAD_SLOT_WAIT = 10.0
"""Seconds an upload waits for a slot before 503 + Retry-After."""
UPLOAD_IDLE = 30.0
"""Seconds an upload may send nothing before it is refused (408) and its slot freed."""
UPLOAD_MAX_SECONDS = 600.0
"""Seconds a whole upload may take (about 450 KB/s for the largest state archive): a node
trickling bytes cannot hold a slot for ever either."""


def deploy_router(
    store: Store,
    deployer: Deployer,
    artifacts: LocalArtifacts,
    tasks: anyio.abc.TaskGroup,
) -> APIRouter:
    router = APIRouter()

    def bad(status: int, error: str, detail: str) -> HTTPException:
        return HTTPException(status, {"error": error, "detail": detail})

    uploads = anyio.Semaphore(UPLOADS)  # each holds its body in memory: at most this many

    async def receive(request: Request, digest: str, limit: int, what: str) -> str:
        with anyio.move_on_after(UPLOAD_SLOT_WAIT) as waited:
            await uploads.acquire()  # only the wait for a slot is bounded so, not the upload
        if waited.cancelled_caught:
            raise HTTPException(
                503,
                {"error": "busy", "detail": f"{UPLOADS} uploads are being received; try again"},
                headers={"Retry-After": "5"},
            )
        try:
            return await receive_one(request, digest, limit, what)
        finally:
            uploads.release()

    async def receive_one(request: Request, digest: str, limit: int, what: str) -> str:
        with anyio.move_on_after(UPLOAD_MAX_SECONDS) as whole:
            chunks = await read_body(request, limit, what)
        if whole.cancel_called:
            raise bad(408, "upload too slow", f"not received in {UPLOAD_MAX_SECONDS:g} s")
        try:
            return await artifacts.put(b"".join(chunks), expected=digest, limit=limit)
        except ArtifactError as exc:
            raise bad(400, f"invalid {what}", str(exc)) from exc
        except ArtifactStorageError as exc:
            raise HTTPException(
                503,
                {"error": "artifact store unavailable", "detail": str(exc)},
                headers={"Retry-After": "5"},
            ) from exc

    async def read_body(request: Request, limit: int, what: str) -> list[bytes]:
        chunks: list[bytes] = []
        size = 0
        body = aiter(request.stream())
        while True:
            with anyio.move_on_after(UPLOAD_IDLE) as idle:
                chunk = await anext(body, None)
            if idle.cancel_called:  # a slow sender must not hold a slot for ever
                raise bad(408, "upload stalled", f"no bytes for {UPLOAD_IDLE:g} s")
            if chunk is None:
                return chunks
            size += len(chunk)
            if size > limit:
                raise bad(413, f"{what} too large", f"the bound is {limit} bytes")
            chunks.append(chunk)

    @router.put("/v1/artifacts/{digest}", status_code=201)
    async def upload(digest: Digest, request: Request) -> dict[str, str]:
        return {"artifact": await receive(request, digest, artifacts.max_bytes, "artifact")}

    @router.put("/v1/states/{digest}", status_code=201)
    async def upload_state(digest: Digest, request: Request) -> dict[str, str]:
        """A node stores a stateful app's archive (fetched back as `/v1/artifacts/{digest}`)."""
        limit = artifacts.state_max_bytes
        return {"archive": await receive(request, digest, limit, "state archive")}

    @router.get("/v1/artifacts/{digest}")
    async def download(digest: Digest) -> Response:
        try:
            data = await artifacts.fetch(digest)
        except ArtifactError as exc:
            raise bad(404, "unknown artifact", str(exc)) from exc
        return Response(data, media_type="application/gzip")

    @router.post("/v1/deploys", status_code=202, response_model=RolloutReport)
    async def deploy(body: DeployRequest) -> RolloutReport:
        try:
            rollout = await deployer.prepare(body.definition, body.artifact)
        except DeployError as exc:
            raise bad(400, "deploy refused", str(exc)) from exc
        if rollout.phase is Phase.ROLLING:
            tasks.start_soon(deployer.roll_out, rollout)
        return RolloutReport.model_validate(rollout, from_attributes=True)

    @router.get("/v1/deploys/{app}/{version}", response_model=RolloutReport)
    async def progress(app: AppName, version: VersionName) -> RolloutReport:
        rollout = await deployer.progress(app, version)
        if rollout is None:
            raise bad(404, "unknown deploy", f"no deploy of {app} {version} in this control plane")
        return RolloutReport.model_validate(rollout, from_attributes=True)

    @router.post("/v1/apps/{app}/rollback", status_code=202, response_model=RolloutReport)
    async def rollback(app: AppName) -> RolloutReport:
        try:
            rollout = await deployer.rollback(app)
        except DeployError as exc:
            raise bad(400, "rollback refused", str(exc)) from exc
        tasks.start_soon(deployer.roll_out, rollout)
        return RolloutReport.model_validate(rollout, from_attributes=True)

    @router.delete("/v1/apps/{app}", status_code=202, response_model=DeletionReport)
    async def delete_app(app: AppName) -> DeletionReport:
        try:
            deletion = await deployer.delete(app)
        except UnknownApp as exc:
            raise bad(404, "unknown app", str(exc)) from exc
        except DeployError as exc:
            raise bad(409, "delete refused", str(exc)) from exc
        return DeletionReport.model_validate(deletion, from_attributes=True)

    @router.get("/v1/apps", response_model=list[AppReport])
    async def apps() -> list[AppReport]:
        found = []
        for item in (await store.list(keys.APPS, App)).items:
            app = item.value
            versions = (await store.list(keys.versions_of(app.name), Version)).items
            found.append(
                AppReport(
                    name=app.name,
                    hosts=list(app.hosts),
                    default_host=app.default_host,
                    active_version=app.active_version,
                    previous_version=app.previous_version,
                    versions=[v.value.version for v in versions],
                )
            )
        return found

    return router
