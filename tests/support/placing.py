"""Sandbox records as the pool controller writes them, for tests that write their own: at
their app's restart generation and placed under the key ring's current key
(`Sandbox.placement`), so that `SecretBook.env_for` answers for them. A record written without
one is a forgery to the book."""

from __future__ import annotations

from wakeful.domain import keys
from wakeful.domain.models import AppSecrets, Sandbox
from wakeful.secrets.keys import KeyRing
from wakeful.store import Store


def placement(ring: KeyRing, sandbox: Sandbox) -> Sandbox:
    """`sandbox` with the placement the pool controller would give it (as it stands)."""
    assert sandbox.node is not None, "a sandbox is placed on a node"
    signed = ring.place(
        sandbox.id, sandbox.app, sandbox.pool, sandbox.node, sandbox.secrets_generation
    )
    return sandbox.model_copy(update={"placement": signed})


async def put_placed(store: Store, ring: KeyRing, sandbox: Sandbox) -> Sandbox:
    """`sandbox` at its app's current restart generation, placed, written; what was written."""
    record = await store.get(keys.secrets(sandbox.app), AppSecrets)
    generation = 0 if record is None else record.value.restart_generation
    placed = placement(ring, sandbox.model_copy(update={"secrets_generation": generation}))
    await store.put(keys.sandbox(placed.id), placed)
    return placed
