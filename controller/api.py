"""Node drain through the control API (behind its bearer token).

POST   /v1/nodes/{node}/drain   cordon the node; with evacuate (the default) its sandboxes
                                are replaced elsewhere first, then drained and stopped
DELETE /v1/nodes/{node}/drain   uncordon: the node takes new sandboxes again
GET    /v1/nodes                every node: cordoned, evacuating, live sandboxes
"""

import re
import time

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel

from store import Store
from wakeful.models import NAME_PATTERN, Cordon, Node, Sandbox, SandboxStatus

from .reconciler import with_cordon

LIVE = (SandboxStatus.PENDING, SandboxStatus.BOOTING, SandboxStatus.RUNNING, SandboxStatus.DRAINING)


class NodeReport(BaseModel):
    name: str
    address: str
    registered: bool
    cordoned: bool
    evacuating: bool
    sandboxes: int


def node_router(store: Store) -> APIRouter:
    router = APIRouter()

    def check(node: str) -> str:
        if not re.match(NAME_PATTERN, node):
            raise HTTPException(
                422, {"error": "invalid request", "detail": f"node: not a node name (got {node!r})"}
            )
        return node

    @router.get("/v1/nodes", response_model=list[NodeReport])
    async def nodes() -> list[NodeReport]:
        registered = {n.value.name: n.value for n in (await store.list("nodes/", Node)).items}
        cordons = {c.value.node: c.value for c in (await store.list("cordons/", Cordon)).items}
        sandboxes = [s.value for s in (await store.list("sandboxes/", Sandbox)).items]
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
                    sandboxes=sum(1 for s in sandboxes if s.node == name and s.status in LIVE),
                )
            )
        return reports

    @router.post("/v1/nodes/{node}/drain", status_code=202)
    async def drain(node: str, evacuate: bool = True) -> dict[str, object]:
        cordon = Cordon(node=check(node), evacuate=evacuate, since=time.time())
        await store.put(f"cordons/{node}", cordon)
        return cordon.model_dump()

    @router.delete("/v1/nodes/{node}/drain", status_code=204)
    async def uncordon(node: str) -> None:
        await store.delete(f"cordons/{check(node)}")

    return router
