"""Node drain through the control API (admin-only, `wakeful.activator.roles`).

POST   /v1/nodes/{node}/drain   cordon the node; with evacuate (the default) its sandboxes
                                are replaced elsewhere first, then drained and stopped. A node
                                that never registered is a 404 (a typo would stay cordoned
                                forever, unseen), unless `force=true`; a registered node whose
                                agent is down can be cordoned.
DELETE /v1/nodes/{node}/drain   uncordon: the node takes new sandboxes again
GET    /v1/nodes                every node: cordoned, evacuating, live sandboxes
"""

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException
from fastapi import Path as PathParam
from pydantic import BaseModel

from wakeful.domain import keys
from wakeful.domain.models import NAME_PATTERN, ON_NODE, Cordon, Node, Sandbox, SeenNode
from wakeful.store import Store

from .reconciler import with_cordon

NodeName = Annotated[str, PathParam(pattern=NAME_PATTERN, description="a node name")]


class NodeReport(BaseModel):
    name: str
    address: str
    registered: bool
    cordoned: bool
    evacuating: bool
    sandboxes: int
    isolation: str = ""


def node_router(store: Store) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/nodes", response_model=list[NodeReport])
    async def nodes() -> list[NodeReport]:
        registered = {n.value.name: n.value for n in (await store.list(keys.NODES, Node)).items}
        cordons = {c.value.node: c.value for c in (await store.list(keys.CORDONS, Cordon)).items}
        sandboxes = [s.value for s in (await store.list(keys.SANDBOXES, Sandbox)).items]
        reports = []
        for name in sorted(set(registered) | set(cordons)):
            node = registered.get(name) or Node(name=name, address="")
            merged = with_cordon(node, cordons.get(name))
            reports.append(
                NodeReport(
                    name=name,
                    address=merged.address,
                    registered=name in registered,
                    cordoned=merged.cordoned,
                    evacuating=merged.evacuating,
                    isolation=merged.isolation,
                    sandboxes=sum(1 for s in sandboxes if s.node == name and s.status in ON_NODE),
                )
            )
        return reports

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
