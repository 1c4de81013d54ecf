"""The deploy half of the control API: artifacts, deploys, rollbacks and apps.

Mounted behind the role check of the control API (`activator.api.create_app`; the decisions
are in `activator.roles`): every route here is admin-only except `GET /v1/artifacts/{digest}`
and the three a node hands a stateful app's state back by, which a node token may call too,
each only for the state its own node holds (`deploy.states`):

PUT  /v1/states/{app}/archives/{digest}?node=N&epoch=E   store the archive of a held state
POST /v1/states/{app}/release                            release it, with that archive
POST /v1/states/{app}/keep                               keep it, saying why

Sandbox output is served by `deploy.logs_api`.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated

import anyio
import anyio.abc
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi import Path as PathParam

from wakeful.aio.marks import Marks
from wakeful.deploy.artifacts import ArtifactStorageError, LocalArtifacts
from wakeful.deploy.errors import DeployError, UnknownApp
from wakeful.deploy.images import Images
from wakeful.deploy.rollout import Phase
from wakeful.deploy.service import Deployer
from wakeful.deploy.states import ArchiveMissing, NotHeld, StateKeeper, StorageFull
from wakeful.deploy.traffic import UnknownTag
from wakeful.deploy.wire import (
    FIGURES_SECONDS,
    AppReport,
    DeletionReport,
    DeployRequest,
    KeepRequest,
    ReleaseRequest,
    RolloutReport,
    RoutedReport,
    SplitRequest,
    TagRequest,
    TrafficReport,
    pinned,
    traffic_report,
)
from wakeful.domain import keys
from wakeful.domain.artifacts import ArtifactError
from wakeful.domain.models import (
    NAME_PATTERN,
    App,
    AppState,
    Role,
    Version,
    made_by,
)
from wakeful.domain.state import Stale
from wakeful.oci import (
    ImageError,
    ImageRefused,
    ImageStorageError,
    LoginUnusable,
    RegistryError,
    SkopeoMissing,
)
from wakeful.store import Store

# Names from a URL are checked before they become store keys: a malformed one is a 422 that
# names the value, never a store error.
AppName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="an app name")]
VersionName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="a version, e.g. v3")]
TagName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="a tag, e.g. beta")]
Digest = Annotated[str, PathParam(pattern=r"^[0-9a-f]{64}$", description="a sha256, hex")]


NodeQuery = Annotated[str, Query(pattern=NAME_PATTERN, description="the node holding it")]
EpochQuery = Annotated[int, Query(ge=1, description="the epoch it holds the state at")]


UPLOADS = 4
"""Artifact uploads (deploys) received at once."""
STATE_UPLOADS = 4
"""State archive uploads (nodes handing states back) received at once: slots of their own, so
that nodes, however they behave, never keep a deploy from uploading."""
STATE_UPLOADS_PER_NODE = 1
"""Of those, what one node may hold: a node trickling bytes holds one slot, not every one."""
UPLOAD_SLOT_WAIT = 10.0
"""Seconds an upload waits for a slot before 503 + Retry-After."""
ROUTED_WAIT_MAX = 30.0
"""The longest `GET /v1/apps/{app}/routed` waits for the ingresses, in seconds."""
UPLOAD_IDLE = 30.0
"""Seconds an upload may send nothing before it is refused (408) and its slot freed."""
UPLOAD_MAX_SECONDS = 600.0
"""Seconds a whole upload may take (about 450 KB/s for the largest state archive): a node
trickling bytes cannot hold a slot for ever either."""


def deploy_router(
    store: Store,
    deployer: Deployer,
    artifacts: LocalArtifacts,
    keeper: StateKeeper,
    tasks: anyio.abc.TaskGroup,
    images: Images | None = None,
    routes_seen: Marks | None = None,
) -> APIRouter:
    """`routes_seen`: the revision of `apps/` each ingress's routes have followed (the
    activator's), which `GET /v1/apps/{app}/routed` waits on."""
    router = APIRouter()
    routes_seen = Marks() if routes_seen is None else routes_seen

    def bad(status: int, error: str, detail: str) -> HTTPException:
        return HTTPException(status, {"error": error, "detail": detail})

    def own_node(request: Request, node: str) -> None:
        """A node token (named after its node) acts only for its own node."""
        token = getattr(request.state, "token", None)
        if token is not None and token.role is Role.NODE and token.name != node:
            raise bad(
                403,
                "forbidden",
                f"this node token is {token.name!r}'s; it cannot act for node {node!r}",
            )

    # Each upload holds its body in memory: at most this many of each kind.
    artifact_slots = anyio.Semaphore(UPLOADS)
    state_slots = anyio.Semaphore(STATE_UPLOADS)
    node_slots: dict[str, anyio.Semaphore] = {}

    async def receive(
        request: Request,
        limit: int,
        what: str,
        keep: Callable[[bytes], Awaitable[str]],
        slots: list[anyio.Semaphore],
    ) -> str:
        """The body, read within `limit` and the upload bounds, then kept by `keep`, holding
        one of each of `slots` (taken in order) meanwhile."""
        held: list[anyio.Semaphore] = []
        try:
            with anyio.move_on_after(UPLOAD_SLOT_WAIT) as waited:
                for slot in slots:  # only the wait for a slot is bounded so, not the upload
                    await slot.acquire()
                    held.append(slot)
            if waited.cancelled_caught:
                raise HTTPException(
                    503,
                    {
                        "error": "busy",
                        "detail": f"as many {what} uploads as are taken at once "
                        "are being received; try again",
                    },
                    headers={"Retry-After": "5"},
                )
            return await receive_one(request, limit, what, keep)
        finally:
            for slot in reversed(held):
                slot.release()

    async def receive_one(
        request: Request, limit: int, what: str, keep: Callable[[bytes], Awaitable[str]]
    ) -> str:
        with anyio.move_on_after(UPLOAD_MAX_SECONDS) as whole:
            chunks = await read_body(request, limit, what)
        if whole.cancel_called:
            raise bad(408, "upload too slow", f"not received in {UPLOAD_MAX_SECONDS:g} s")
        try:
            return await keep(b"".join(chunks))
        except NotHeld as exc:
            raise bad(409, "state not held", str(exc)) from exc
        except StorageFull as exc:
            raise full(exc) from exc
        except ArtifactError as exc:
            raise bad(400, f"invalid {what}", str(exc)) from exc
        except ArtifactStorageError as exc:
            raise HTTPException(
                503,
                {"error": "artifact store unavailable", "detail": str(exc)},
                headers={"Retry-After": "5"},
            ) from exc

    def full(exc: StorageFull) -> HTTPException:
        return HTTPException(
            507,
            {"error": "state archives pending", "detail": str(exc)},
            headers={"Retry-After": str(exc.retry_after)},
        )

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
        limit = artifacts.max_bytes

        async def keep(data: bytes) -> str:
            return await artifacts.put(data, expected=digest, limit=limit)

        return {"artifact": await receive(request, limit, "artifact", keep, [artifact_slots])}

    @router.put("/v1/states/{app}/archives/{digest}", status_code=201)
    async def upload_state(
        app: AppName, digest: Digest, node: NodeQuery, epoch: EpochQuery, request: Request
    ) -> dict[str, str]:
        """The node holding `app`'s state at `epoch` stores its archive (fetched back as
        `/v1/artifacts/{digest}`). Refused before the body is read when the node does not
        hold it, or past the bounds on what is stored and not yet released."""
        own_node(request, node)
        limit = artifacts.state_max_bytes
        declared = request.headers.get("content-length", "")
        # What it will store is counted now, as pending, whatever comes: at most the bound.
        size = min(int(declared), limit) if declared.isdigit() else limit
        try:
            ticket = await keeper.admit(node, app, epoch, size)
        except NotHeld as exc:
            raise bad(409, "state not held", str(exc)) from exc
        except StorageFull as exc:
            raise full(exc) from exc

        async def keep(data: bytes) -> str:
            await keeper.store_archive(node, app, epoch, data, digest, ticket)
            return digest

        mine = node_slots.setdefault(node, anyio.Semaphore(STATE_UPLOADS_PER_NODE))
        try:
            slots = [mine, state_slots]
            return {"archive": await receive(request, limit, "state archive", keep, slots)}
        finally:
            keeper.cancel(ticket)
            if mine.value == STATE_UPLOADS_PER_NODE and not mine.statistics().tasks_waiting:
                node_slots.pop(node, None)

    @router.post("/v1/states/{app}/release", response_model=AppState)
    async def release_state(app: AppName, body: ReleaseRequest, request: Request) -> AppState:
        """The node holding `app`'s state at `body.epoch` hands it back: 409 when it does not
        (nothing written), 404 when the record is gone, 412 when `body.sandbox` moved on."""
        own_node(request, body.node)
        sandbox_at = None if body.sandbox is None else (body.sandbox.id, body.sandbox.revision)
        try:
            written = await keeper.release(
                body.node,
                app,
                body.epoch,
                archive=body.archive,
                size=body.size,
                error=body.error,
                sandbox_at=sandbox_at,
            )
        except ArchiveMissing as exc:
            raise bad(400, "archive not stored", str(exc)) from exc
        return settled(app, written, body.sandbox is not None)

    @router.post("/v1/states/{app}/keep", response_model=AppState)
    async def keep_state(app: AppName, body: KeepRequest, request: Request) -> AppState:
        """The node holding `app`'s state at `body.epoch` keeps it, saying why."""
        own_node(request, body.node)
        written = await keeper.keep(body.node, app, body.epoch, body.error, for_good=body.for_good)
        return settled(app, written, False)

    def settled(app: str, written: AppState | Stale | None, conditional: bool) -> AppState:
        if isinstance(written, Stale):
            raise bad(409, "state moved", written.reason)
        if written is None and conditional:
            raise bad(412, "sandbox changed", "its sandbox's record changed: nothing written")
        if written is None:
            raise bad(404, "unknown state", f"app {app!r} has no state record")
        return written

    @router.get("/v1/artifacts/{digest}")
    async def download(digest: Digest) -> Response:
        try:
            data = await artifacts.fetch(digest)
        except ArtifactError as exc:
            raise bad(404, "unknown artifact", str(exc)) from exc
        return Response(data, media_type="application/gzip")

    @router.post("/v1/deploys", status_code=202, response_model=RolloutReport)
    async def deploy(body: DeployRequest) -> RolloutReport:
        image = body.definition.spec.image
        try:
            record = None
            if image is not None:
                if images is None:
                    raise DeployError("this control plane has no image store")
                await deployer.check(body.definition)  # refused before a pull, not after
                record = await images.resolve(
                    image, body.image_archive, body.image_manifest, body.definition.name
                )
            rollout = await deployer.prepare(
                body.definition,
                body.artifact,
                record,
                body.made,
                body.canary,
                body.ramp,
                body.keep_split,
            )
        except (DeployError, ImageRefused) as exc:
            raise bad(400, "deploy refused", str(exc)) from exc
        except (RegistryError, SkopeoMissing) as exc:  # the registry's answer, or a tool
            raise bad(400, "image not pulled", str(exc)) from exc
        except ImageStorageError as exc:
            raise HTTPException(
                503,
                {"error": "image store unavailable", "detail": str(exc)},
                headers={"Retry-After": "5"},
            ) from exc
        except LoginUnusable as exc:  # the control plane's keys, not the image
            raise HTTPException(
                503,
                {"error": "registry login unusable", "detail": str(exc)},
                headers={"Retry-After": "5"},
            ) from exc
        except ImageError as exc:  # anything else about the image: its message says what
            raise bad(400, "image not pulled", str(exc)) from exc
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
        except UnknownApp as exc:
            raise bad(404, "unknown app", str(exc)) from exc
        except DeployError as exc:
            raise bad(400, "rollback refused", str(exc)) from exc
        if rollout.phase is Phase.ROLLING:
            tasks.start_soon(deployer.roll_out, rollout)
        return RolloutReport.model_validate(rollout, from_attributes=True)

    async def changed(change: Awaitable[App]) -> TrafficReport:
        try:
            app = await change
        except UnknownTag as exc:
            raise bad(404, "unknown tag", str(exc)) from exc
        except UnknownApp as exc:
            raise bad(404, "unknown app", str(exc)) from exc
        except DeployError as exc:
            raise bad(400, "traffic change refused", str(exc)) from exc
        return traffic_report(app, deployer.windows(app.name, FIGURES_SECONDS))

    @router.get("/v1/apps/{app}/traffic", response_model=TrafficReport)
    async def traffic(app: AppName) -> TrafficReport:
        found = await store.get(keys.app(app), App)
        if found is None:
            raise bad(404, "unknown app", f"no app named {app!r}")
        return traffic_report(found.value, deployer.windows(app, FIGURES_SECONDS))

    @router.put("/v1/apps/{app}/traffic", response_model=TrafficReport)
    async def set_traffic(app: AppName, body: SplitRequest) -> TrafficReport:
        return await changed(deployer.traffic.split(app, body.split))

    @router.post("/v1/apps/{app}/promote", response_model=TrafficReport)
    async def promote(app: AppName) -> TrafficReport:
        return await changed(deployer.traffic.promote(app))

    @router.put("/v1/apps/{app}/tags/{tag}", response_model=TrafficReport)
    async def tag(app: AppName, tag: TagName, body: TagRequest) -> TrafficReport:
        return await changed(deployer.traffic.tag(app, tag, body.version))

    @router.delete("/v1/apps/{app}/tags/{tag}", response_model=TrafficReport)
    async def untag(app: AppName, tag: TagName) -> TrafficReport:
        return await changed(deployer.traffic.untag(app, tag))

    @router.get("/v1/apps/{app}/routed", response_model=RoutedReport)
    async def routed(
        app: AppName,
        within: Annotated[float, Query(ge=0, le=ROUTED_WAIT_MAX)] = 0.0,
    ) -> RoutedReport:
        """Waits up to `within` seconds until every ingress that says how far its routes
        have come has followed the store past the app's record (what `wakeful deploy` waits
        for before it returns); answers who is still behind then."""
        found = await store.get(keys.app(app), App)
        if found is None:
            raise bad(404, "unknown app", f"no app named {app!r}")
        behind = await routes_seen.wait(found.revision, within)
        return RoutedReport(
            app=app, revision=found.revision, ingresses=len(routes_seen), behind=behind
        )

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
                    split=dict(app.split),
                    tags=dict(app.tags),
                    images={
                        v.value.version: pinned(v.value.image)
                        for v in versions
                        if v.value.image is not None
                    },
                    made={v.value.version: made_by(v.value) for v in versions},
                )
            )
        return found

    return router
