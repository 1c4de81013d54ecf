"""The deploy half of the control API: artifacts, deploys, rollbacks, apps and logs.

Mounted behind the same bearer token as the lease API (see `activator.api.create_app`).
"""

from pathlib import Path

import anyio.abc
from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel

from store import Store
from wakeful.models import App, Sandbox, Version

from .appdir import AppDefinition
from .artifacts import ArtifactError, ArtifactStorageError, LocalArtifacts
from .service import Deployer, DeployError, Phase


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


class AppReport(BaseModel):
    name: str
    hosts: list[str]
    active_version: str | None
    previous_version: str | None
    versions: list[str]


def deploy_router(
    store: Store,
    deployer: Deployer,
    artifacts: LocalArtifacts,
    tasks: anyio.abc.TaskGroup,
    data_dir: Path | None = None,
) -> APIRouter:
    router = APIRouter()

    def bad(status: int, error: str, detail: str) -> HTTPException:
        return HTTPException(status, {"error": error, "detail": detail})

    @router.put("/v1/artifacts/{digest}", status_code=201)
    async def upload(digest: str, request: Request) -> dict[str, str]:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise bad(422, "invalid request", f"digest: not a sha256 hex string (got {digest!r})")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > artifacts.max_bytes:
                raise bad(413, "artifact too large", f"the bound is {artifacts.max_bytes} bytes")
            chunks.append(chunk)
        try:
            stored = await artifacts.put(b"".join(chunks), expected=digest)
        except ArtifactError as exc:
            raise bad(400, "invalid artifact", str(exc)) from exc
        except ArtifactStorageError as exc:
            raise HTTPException(
                503,
                {"error": "artifact store unavailable", "detail": str(exc)},
                headers={"Retry-After": "5"},
            ) from exc
        return {"artifact": stored}

    @router.get("/v1/artifacts/{digest}")
    async def download(digest: str) -> Response:
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
            tasks.start_soon(deployer.roll_out, rollout, list(body.definition.hosts))
        return RolloutReport.model_validate(rollout, from_attributes=True)

    @router.get("/v1/deploys/{app}/{version}", response_model=RolloutReport)
    async def progress(app: str, version: str) -> RolloutReport:
        rollout = deployer.rollouts.get((app, version))
        if rollout is None:
            raise bad(404, "unknown deploy", f"no deploy of {app} {version} in this control plane")
        return RolloutReport.model_validate(rollout, from_attributes=True)

    @router.post("/v1/apps/{app}/rollback", status_code=202, response_model=RolloutReport)
    async def rollback(app: str) -> RolloutReport:
        try:
            rollout = await deployer.rollback(app)
        except DeployError as exc:
            raise bad(400, "rollback refused", str(exc)) from exc
        current = await store.get(f"apps/{app}", App)
        hosts = list(current.value.hosts) if current else []
        tasks.start_soon(deployer.roll_out, rollout, hosts)
        return RolloutReport.model_validate(rollout, from_attributes=True)

    @router.get("/v1/apps", response_model=list[AppReport])
    async def apps() -> list[AppReport]:
        found = []
        for item in (await store.list("apps/", App)).items:
            app = item.value
            versions = (await store.list(f"versions/{app.name}/", Version)).items
            found.append(
                AppReport(
                    name=app.name,
                    hosts=list(app.hosts),
                    active_version=app.active_version,
                    previous_version=app.previous_version,
                    versions=[v.value.version for v in versions],
                )
            )
        return found

    @router.get("/v1/apps/{app}/logs")
    async def app_logs(app: str, tail: int = 200) -> Response:
        """The last lines of every sandbox of the app that ran on this machine."""
        if data_dir is None:
            raise bad(404, "no logs", "this control plane runs no node agent")
        sandboxes = [s.value for s in (await store.list("sandboxes/", Sandbox)).items]
        parts: list[str] = []
        for sandbox in sorted(sandboxes, key=lambda s: s.created_at):
            if sandbox.app != app:
                continue
            path = anyio.Path(data_dir / "sandboxes" / sandbox.id / "output.log")
            if not await path.exists():
                continue
            text = await path.read_text(errors="replace")
            lines = text.splitlines()[-max(1, min(tail, 10_000)) :]
            parts.extend(f"[{sandbox.id}] {line}" for line in lines)
        return Response("\n".join(parts) + ("\n" if parts else ""), media_type="text/plain")

    @router.get("/v1/sandboxes/{sandbox_id}/log")
    async def sandbox_log(sandbox_id: str, tail: int = 200) -> Response:
        if data_dir is None or "/" in sandbox_id or sandbox_id.startswith("."):
            raise bad(404, "unknown sandbox", f"no log for {sandbox_id!r} on this machine")
        path = data_dir / "sandboxes" / sandbox_id / "output.log"
        if not await anyio.Path(path).exists():
            raise bad(404, "unknown sandbox", f"no log for {sandbox_id!r} on this machine")
        text = await anyio.Path(path).read_text(errors="replace")
        lines = text.splitlines()[-max(1, min(tail, 10_000)) :]
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    return router
