"""The data model: what lives in the store, one pydantic model per kind of key.

Every model validates on construction and on load, so a value read back from the store is
as trustworthy as one built in code. Validation errors name the field and the value that
was refused (`describe_validation_error`). Every name is importable from here, whichever
module below defines it:

- `base.py`: `Model` (unknown fields refused, frozen, finite floats), the name, host, sandbox
  id and digest patterns, `describe_validation_error`.
- `apps.py`: an app as deployed: `AppSpec` and its parts (`HealthCheck`, `Concurrency`,
  `Resources` with `parse_size`, `StateSpec`), `App`, `Version`, and `AppState` (who holds a
  stateful app's state).
- `pools.py`: `Pool` with its `ScaleChange`, `Sandbox`, `SandboxStatus` and the named sets of
  statuses (`STARTING`, `SIZED`, `ON_NODE`, `HAS_PROCESS`, `GONE`, `FINISHED`).
- `nodes.py`: `Node` with its `Tunnel` and `Frozen` sandboxes, `Cordon`, `SeenNode`,
  `IngressReplica`.
- `control.py`: the control plane's own records: `RolloutRecord`, `Leader`, `SessionKey`.
- `tokens.py`: `Token` and its `Role`.

| key                         | model          | module     |
|-----------------------------|----------------|------------|
| `apps/{app}`                | App            | `apps`     |
| `versions/{app}/{version}`  | Version        | `apps`     |
| `states/{app}`              | AppState       | `apps`     |
| `pools/{pool}`              | Pool           | `pools`    |
| `sandboxes/{id}`            | Sandbox        | `pools`    |
| `nodes/{node}`              | Node           | `nodes`    |
| `cordons/{node}`            | Cordon         | `nodes`    |
| `seen/{node}`               | SeenNode       | `nodes`    |
| `ingresses/{replica}`       | IngressReplica | `nodes`    |
| `rollouts/{app}/{version}`  | RolloutRecord  | `control`  |
| `leaders/{role}`            | Leader         | `control`  |
| `ui/session-key`            | SessionKey     | `control`  |
| `tokens/{name}`             | Token          | `tokens`   |
"""

from .apps import (
    ENV_NAME,
    MAX_SIZE,
    MIN_SIZE,
    RESERVED_ENV,
    SIZE,
    STATE_PATH,
    UNITS,
    App,
    AppSpec,
    AppState,
    Concurrency,
    HealthCheck,
    Resources,
    StateSpec,
    Version,
    format_size,
    parse_size,
)
from .base import (
    HOST_PATTERN,
    NAME_PATTERN,
    SANDBOX_ID_PATTERN,
    Digest,
    Host,
    Model,
    Name,
    describe_validation_error,
)
from .control import Leader, RolloutRecord, SessionKey
from .nodes import Cordon, Frozen, IngressReplica, Node, ReplicaCoverage, SeenNode, Tunnel
from .pools import (
    FINISHED,
    GONE,
    HAS_PROCESS,
    ON_NODE,
    SIZED,
    STARTING,
    Pool,
    Sandbox,
    SandboxStatus,
    ScaleChange,
)
from .tokens import ADMIN_TOKEN, Role, Token

__all__ = [
    "ADMIN_TOKEN",
    "ENV_NAME",
    "FINISHED",
    "GONE",
    "HAS_PROCESS",
    "HOST_PATTERN",
    "MAX_SIZE",
    "MIN_SIZE",
    "NAME_PATTERN",
    "ON_NODE",
    "RESERVED_ENV",
    "SANDBOX_ID_PATTERN",
    "SIZE",
    "SIZED",
    "STARTING",
    "STATE_PATH",
    "UNITS",
    "App",
    "AppSpec",
    "AppState",
    "Concurrency",
    "Cordon",
    "Digest",
    "Frozen",
    "HealthCheck",
    "Host",
    "IngressReplica",
    "Leader",
    "Model",
    "Name",
    "Node",
    "Pool",
    "ReplicaCoverage",
    "Resources",
    "Role",
    "RolloutRecord",
    "Sandbox",
    "SandboxStatus",
    "ScaleChange",
    "SeenNode",
    "SessionKey",
    "StateSpec",
    "Token",
    "Tunnel",
    "Version",
    "describe_validation_error",
    "format_size",
    "parse_size",
]
