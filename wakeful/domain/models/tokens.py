"""Control API tokens and the roles they carry.

| key             | model |
|-----------------|-------|
| `tokens/{name}` | Token |
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import StringConstraints

from wakeful.domain.models.base import Model, Name


class Role(StrEnum):
    """What a control API token may do: admin everything, node fetch artifacts and push logs,
    ingress take, renew and release leases (the route map: `wakeful.activator.roles`)."""

    ADMIN = "admin"
    NODE = "node"
    INGRESS = "ingress"


ADMIN_TOKEN = "admin"
UP_INGRESS_TOKEN = "up-ingress"
"""The ingress token `wakeful up` makes (or replaces) at each start for its ingress workers
(WAKEFUL_INGRESS_WORKERS), and deletes when it stops: nobody else creates or rotates it."""
"""The name of the control plane's own admin token (`wakeful tokens rotate-admin`)."""


class Token(Model):
    """A control API token (`tokens/{name}`): the sha256 of its secret (32 random bytes, shown
    once), never the secret. `id` is new with every secret; `rotated_at` None until rotated."""

    name: Name
    role: Role
    id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,32}$")]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    created_at: float = 0.0
    rotated_at: float | None = None
