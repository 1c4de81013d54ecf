"""What node tests share: an agent's settings, and the sample app's version and pool recorded
as a deploy leaves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wakeful.domain import keys
from wakeful.domain.models import AppSpec, Pool, Version
from wakeful.node.settings import NodeSettings
from wakeful.store import Store


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
