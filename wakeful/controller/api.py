"""Node drain through the control API (admin-only, `wakeful.activator.roles`).

POST   /v1/nodes/{node}/drain   cordon the node; with evacuate (the default) its sandboxes
                                are replaced elsewhere first, then drained and stopped. A node
                                that never registered is a 404 (a typo would stay cordoned
                                forever, unseen), unless `force=true`; a registered node whose
                                agent is down can be cordoned.
DELETE /v1/nodes/{node}/drain   uncordon: the node takes new sandboxes again
GET    /v1/nodes                every node: cordoned, evacuating, live sandboxes, and while it
                                evacuates, its progress (`Progress`)
GET    /v1/nodes/{node}         one node, the same
POST   /v1/apps/{app}/state/release
                                give up on what a node holds of a stateful app's state (kept
                                there, or the node is gone): released with its last archive;
                                refused while a sandbox of the app is on a node
"""

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException
from fastapi import Path as PathParam
from pydantic import BaseModel

from wakeful.domain import keys
from wakeful.domain.models import (
    FINISHED,
    NAME_PATTERN,
    ON_NODE,
    AppState,
    Cordon,
    Frozen,
    ImageCacheUse,
    Node,
    Pool,
    Sandbox,
    SandboxStatus,
    SeenNode,
    Tunnel,
)
from wakeful.domain.state import Stale, take_back
from wakeful.store import Conflict, Store

from .plan import with_cordon

NodeName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="a node name")]
AppName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="an app name")]


class Problem(BaseModel):
    app: str
    sandbox: str | None = None
    reason: str


class Progress(BaseModel):
    """What a drain of a node has done. `owned`: sandboxes still on it; `running`: of those,
    running; `moving`: stateful sandboxes gated or stopping there, and states it handed back
    that wait for their new node; `archived`: states it handed back that rest (their app is at
    zero: they wake on any node); `moved`: states adopted elsewhere since the drain began;
    `failed`: what cannot leave, each in `problems` with the reason. `done`: nothing is left
    to move, or what is left cannot move."""

    owned: int = 0
    running: int = 0
    moving: int = 0
    archived: int = 0
    moved: int = 0
    failed: int = 0
    done: bool = True
    problems: list[Problem] = []


class NodeReport(BaseModel):
    name: str
    address: str
    registered: bool
    cordoned: bool
    evacuating: bool
    sandboxes: int
    isolation: str = ""
    progress: Progress | None = None
    """While it is drained with evacuation."""
    kept: list[Problem] = []
    """Stateful apps' states it keeps because it could not hand them back (`wakeful
    release-state APP` gives up on one)."""
    tunnel: Tunnel | None = None
    """A dial-out node's reachability and its streams per ingress replica (seed 003)."""
    suspended: int = 0
    suspended_memory: int = 0
    suspended_memory_cap: int = 0
    """Its frozen sandboxes, the bytes they hold and the most they may (the suspended tier)."""
    memory_pressure: bool = False
    """Less than its floor of memory is available: it asks for one frozen sandbox more a pass."""
    evict_bytes: int = 0
    """How much of that memory it asks to give up."""
    evict: list[Frozen] = []
    """Its frozen sandboxes to give it up from, the longest suspended first (while it asks)."""
    image_cache: ImageCacheUse | None = None
    """Its image cache: unpacked images, their bytes and bound, hits and misses."""


LEAVING = frozenset({SandboxStatus.DRAINING, SandboxStatus.STOPPING})


def progress(
    node: str,
    since: float,
    sandboxes: list[Sandbox],
    states: list[AppState],
    pools: dict[str, Pool],
    nodes: list[Node],
) -> Progress:
    """A drain's progress on `node` since `since` (see `Progress`), from what the store holds."""
    here = [s for s in sandboxes if s.node == node and s.status in ON_NODE | LEAVING]
    stateful = {name for name, pool in pools.items() if pool.spec.state is not None}
    wanted = {
        pool.app for pool in pools.values() if not pool.retired and pool.desired_instances > 0
    }
    peers = [n for n in nodes if n.name != node and not n.cordoned and not n.evacuating]
    report = Progress(owned=len(here))
    report.running = sum(
        1 for s in here if s.status in (SandboxStatus.RUNNING, SandboxStatus.SUSPENDED)
    )
    report.moving = sum(1 for s in here if s.pool in stateful and s.status in LEAVING)
    on_node = {s.id for s in here}
    for held in states:
        if held.node == node and held.kept:
            report.problems.append(Problem(app=held.app, sandbox=held.sandbox, reason=held.error))
        elif held.node == node and held.sandbox not in on_node:
            report.moving += 1  # its sandbox has stopped; the state is being handed back
        elif held.node is None and held.released_by == node and held.released_at >= since:
            if held.app in wanted:
                report.moving += 1
            else:
                report.archived += 1
        if held.moved_from == node and held.moved_at >= since and held.node not in (None, node):
            report.moved += 1
    if not peers:
        for sandbox in here:
            reason = "no other node takes sandboxes (all are cordoned or gone)"
            report.problems.append(Problem(app=sandbox.app, sandbox=sandbox.id, reason=reason))
    report.failed = len(report.problems)
    stuck = {p.sandbox for p in report.problems}
    report.done = report.moving == 0 and all(s.id in stuck for s in here)
    return report


def node_router(store: Store) -> APIRouter:
    router = APIRouter()

    async def reports(only: str | None = None) -> list[NodeReport]:
        registered = {n.value.name: n.value for n in (await store.list(keys.NODES, Node)).items}
        cordons = {c.value.node: c.value for c in (await store.list(keys.CORDONS, Cordon)).items}
        sandboxes = [s.value for s in (await store.list(keys.SANDBOXES, Sandbox)).items]
        states = [s.value for s in (await store.list(keys.STATES, AppState)).items]
        pools = {p.value.name: p.value for p in (await store.list(keys.POOLS, Pool)).items}
        merged_nodes = [with_cordon(n, cordons.get(name)) for name, n in registered.items()]
        found = []
        for name in sorted(set(registered) | set(cordons)):
            if only is not None and name != only:
                continue
            node = registered.get(name) or Node(name=name, address="")
            cordon = cordons.get(name)
            merged = with_cordon(node, cordon)
            moving = None
            if cordon is not None and cordon.evacuate:
                moving = progress(name, cordon.since, sandboxes, states, pools, merged_nodes)
            found.append(
                NodeReport(
                    name=name,
                    address=merged.address,
                    registered=name in registered,
                    cordoned=merged.cordoned,
                    evacuating=merged.evacuating,
                    isolation=merged.isolation,
                    sandboxes=sum(1 for s in sandboxes if s.node == name and s.status in ON_NODE),
                    progress=moving,
                    kept=[
                        Problem(app=held.app, sandbox=held.sandbox, reason=held.error)
                        for held in states
                        if held.node == name and held.kept
                    ],
                    tunnel=node.tunnel,
                    suspended=node.suspended,
                    suspended_memory=node.suspended_memory,
                    suspended_memory_cap=node.suspended_memory_cap,
                    memory_pressure=node.memory_pressure,
                    evict_bytes=node.evict_bytes,
                    evict=list(node.evict),
                    image_cache=node.image_cache,
                )
            )
        return found

    @router.post("/v1/apps/{app}/state/release")
    async def release_state(app: AppName) -> dict[str, object]:
        found = await store.get(keys.state(app), AppState)
        if found is None:
            raise HTTPException(
                404, {"error": "unknown state", "detail": f"app {app!r} has no state record"}
            )
        held = found.value
        if held.node is None:
            raise HTTPException(
                409, {"error": "not held", "detail": f"the state of {app!r} is held by no node"}
            )
        registered = await store.get(keys.node(held.node), Node) is not None
        if not held.kept and registered:
            raise HTTPException(
                409,
                {
                    "error": "in hand",
                    "detail": f"node {held.node} holds the state and is up: it hands it back "
                    "itself (only a state it keeps, or one a gone node holds, can be freed)",
                },
            )
        sandboxes = (await store.list(keys.SANDBOXES, Sandbox)).items
        if any(s.value.id == held.sandbox and s.value.status not in FINISHED for s in sandboxes):
            raise HTTPException(
                409,
                {
                    "error": "in use",
                    "detail": f"sandbox {held.sandbox} on node {held.node} has not ended: its "
                    "node hands the state back itself when it does",
                },
            )
        why = f"freed by an operator from node {held.node}" + (
            f", which kept it: {held.error}" if held.kept else ", which is gone"
        )
        released = take_back(held, held.node, time.time(), why)
        if isinstance(released, Stale):
            raise HTTPException(409, {"error": "moved", "detail": released.reason})
        try:
            await store.update(found.key, released, expect_revision=found.revision)
        except Conflict as exc:
            raise HTTPException(
                409, {"error": "moved", "detail": "the state changed meanwhile: look again"}
            ) from exc
        return released.model_dump()

    @router.get("/v1/nodes", response_model=list[NodeReport])
    async def nodes() -> list[NodeReport]:
        return await reports()

    @router.get("/v1/nodes/{node}", response_model=NodeReport)
    async def one_node(node: NodeName) -> NodeReport:
        found = await reports(node)
        if not found:
            raise HTTPException(
                404, {"error": "unknown node", "detail": f"no node named {node!r} is registered"}
            )
        return found[0]

    @router.post("/v1/nodes/{node}/drain", status_code=202)
    async def drain(
        node: NodeName, evacuate: bool = True, force: bool = False
    ) -> dict[str, object]:
        known = (
            await store.get(keys.seen(node), SeenNode) is not None
            or await store.get(keys.node(node), Node) is not None
            or await store.get(keys.cordon(node), Cordon) is not None
        )
        if not known and not force:
            raise HTTPException(
                404,
                {
                    "error": "unknown node",
                    "detail": f"no node named {node!r} has ever registered "
                    "(force=true cordons it anyway)",
                },
            )
        cordon = Cordon(node=node, evacuate=evacuate, since=time.time())
        await store.put(keys.cordon(node), cordon)
        return cordon.model_dump()

    @router.delete("/v1/nodes/{node}/drain", status_code=204)
    async def uncordon(node: NodeName) -> None:
        await store.delete(keys.cordon(node))

    return router
