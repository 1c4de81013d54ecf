"""What node tests share: an agent's settings, the sample app's version and pool recorded as a
deploy leaves them, a sandbox placed on the node and its status awaited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from wakeful.domain import keys
from wakeful.domain.models import (
    AppSpec,
    Pool,
    Sandbox,
    SandboxStatus,
    Version,
)
from wakeful.node.jail.uids import UidTable
from wakeful.node.settings import NodeSettings
from wakeful.store import Event, Store


async def status_of(store: Store, sandbox_id: str, *wanted: SandboxStatus) -> Sandbox:
    """The record once its status is one of `wanted`: listed, then followed by a watch."""
    key = keys.sandbox(sandbox_id)
    with anyio.fail_after(20):
        listing = await store.list(keys.SANDBOXES, Sandbox)
        for item in listing.items:
            if item.key == key and item.value.status in wanted:
                return item.value
        changes = store.watch(key, listing.revision + 1)
        try:
            async for change in changes:
                assert isinstance(change, Event), "the watch lost continuity"
                if change.key == key and change.kind == "put":
                    sandbox = change.decode(Sandbox)
                    if sandbox.status in wanted:
                        return sandbox
        finally:
            await changes.aclose()  # type: ignore[attr-defined]
    raise AssertionError(f"the watch on {key} ended")


async def place(store: Store, sandbox_id: str, pool: str) -> None:
    await store.create(
        keys.sandbox(sandbox_id),
        Sandbox(id=sandbox_id, pool=pool, app=pool.split("-")[0], node="n1", owner="n1", epoch=1),
    )


async def put_hello(store: Store, spec: AppSpec, artifact: str | None) -> None:
    """`hello` v1 with `spec`, and its pool `hello-v1` at one instance."""
    await store.put(
        keys.version("hello", "v1"),
        Version(app="hello", version="v1", spec=spec, artifact=artifact),
    )
    await store.put(
        keys.pool("hello-v1"),
        Pool(name="hello-v1", app="hello", version="v1", spec=spec, desired_instances=1),
    )


def agent_settings(data_dir: Path, **fields: Any) -> NodeSettings:
    """Node `n1` on the memory store, unisolated: these tests are about the agent's own logic
    (isolation has tests/node/jail/test_isolation.py and tests/security)."""
    return NodeSettings(
        isolation="none", store_url="memory://", node_name="n1", data_dir=data_dir, **fields
    )


def uid_table(data_dir: Path) -> UidTable:
    """The table of `data_dir`, its machine-wide claims kept beside it (not in /run)."""
    return UidTable(data_dir / "uids.json", claims=data_dir / "claims")
