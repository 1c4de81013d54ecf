"""Pools and their sandboxes: a pool's size and why it last changed, a sandbox's record, its
statuses and the named sets of them (the transitions are `wakeful.domain.lifecycle`'s).

| key              | model   |
|------------------|---------|
| `pools/{pool}`   | Pool    |
| `sandboxes/{id}` | Sandbox |
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from wakeful.domain.models.apps import AppSpec
from wakeful.domain.models.base import SANDBOX_ID_PATTERN, Model, Name


class ScaleChange(Model):
    """Why a pool last changed size: written in the same compare-and-set as the size, by the
    activator (`demand`, or `memory` when a node's suspended sandboxes hold more than its cap)
    or the idle monitor (`idle`). The dashboard's scale events."""

    at: float
    """Wall-clock time of the write."""
    by: Literal["demand", "idle", "memory"]
    from_instances: int = Field(ge=0)
    to_instances: int = Field(ge=0)
    reason: str = Field(max_length=300)
    """The numbers it decided on, for a person: `demand: 3 leased + 12 waiting at 10 per
    sandbox`, `idle: 2 sandbox(es) carried no traffic for 30 s`."""


class Pool(Model):
    """The sized set of sandboxes serving one version. Written only by compare-and-set."""

    name: Name
    app: Name
    version: Name
    spec: AppSpec
    desired_instances: int = Field(default=0, ge=0, le=1000)
    retired: bool = False
    retired_at: float = 0.0
    """When it stopped taking traffic; the idle monitor deletes it after a retention time."""
    deleted: bool = False
    """Its app was deleted: the idle monitor removes it as soon as nothing runs in it."""
    crash_cooldown_until: float = 0.0
    crash_count: int = Field(default=0, ge=0)
    last_crash_log: str = ""
    last_scale: ScaleChange | None = None

    @property
    def min_instances(self) -> int:
        return self.spec.concurrency.min_instances

    @property
    def max_instances(self) -> int:
        return self.spec.concurrency.max_instances

    @property
    def requests_per_instance(self) -> int:
        return self.spec.concurrency.requests_per_instance


class SandboxStatus(StrEnum):
    PENDING = "pending"
    BOOTING = "booting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    DEAD = "dead"


# Named sets of statuses, defined once (a sandbox's transitions are wakeful.domain.lifecycle's).
STARTING = frozenset({SandboxStatus.PENDING, SandboxStatus.BOOTING})
"""Placed, not yet serving."""
SIZED = frozenset(
    {SandboxStatus.PENDING, SandboxStatus.BOOTING, SandboxStatus.RUNNING, SandboxStatus.SUSPENDED}
)
"""Counted in a pool's size: what the pool controller and the activator call live. A
suspended sandbox counts: it is frozen, not gone, and wakes faster than any start."""
ON_NODE = SIZED | {SandboxStatus.DRAINING}
"""Still occupying its node: what a drain waits for."""
HAS_PROCESS = frozenset(
    {
        SandboxStatus.BOOTING,
        SandboxStatus.RUNNING,
        SandboxStatus.SUSPENDED,
        SandboxStatus.DRAINING,
        SandboxStatus.STOPPING,
    }
)
"""A process of its node runs it (or may): it has output, and a restarted agent must bury it."""
GONE = frozenset({SandboxStatus.STOPPING, SandboxStatus.STOPPED, SandboxStatus.DEAD})
"""Leaving or left: it takes no lease."""
FINISHED = frozenset({SandboxStatus.STOPPED, SandboxStatus.DEAD})
"""Its record only waits to be cleaned up."""


class Sandbox(Model):
    id: Annotated[str, StringConstraints(pattern=SANDBOX_ID_PATTERN)]
    pool: Name
    app: Name
    node: Name | None = None
    status: SandboxStatus = SandboxStatus.PENDING
    address: str | None = None
    ready: bool = False
    last_activity: float = 0.0
    owner: Name | None = None
    epoch: int = Field(default=0, ge=0)
    exit_code: int | None = None
    last_log: str = ""
    created_at: float = 0.0
    ready_at: float = 0.0
    """Wall-clock time its node found it ready (0: not yet). Idleness counts from it at the
    earliest: a sandbox whose boot outlasted its app's `scale_down_delay` is not idle the
    moment it is ready, before the request that woke it is recorded as activity."""
    draining_since: float = 0.0
    """Wall-clock time the pool controller drained it (0: never drained)."""
    suspended_at: float = 0.0
    """Wall-clock time the activator suspended it (0 unless `suspended`): the longest
    suspended goes first when its node's memory cap is passed, and a scale-down stops
    suspended sandboxes before running ones."""
    secrets_generation: int = Field(default=0, ge=0)
    """The app's `restart_generation` (`AppSecrets`) when the pool controller created it: a
    sandbox behind the app's current one started with secrets that changed since."""
    placement: str = Field(default="", max_length=100)
    """The control plane's word that it placed this sandbox, on `node`, for `app` in `pool`,
    at `secrets_generation`: `v1:<key id>:<urlsafe base64 of an HMAC-SHA256 of those fields>`
    under a key derived from a secrets key (`wakeful.secrets.sealing`). Written by the pool
    controller when it creates the record, never by a node (which may write `sandboxes/` but
    holds no key): a node gets an app's secrets only for a sandbox whose placement verifies.
    Empty where the control plane has no key ring (tests of the controller alone)."""

    @property
    def routable(self) -> bool:
        """Admission may place a request here: running, ready, addressed, not draining."""
        return self.status is SandboxStatus.RUNNING and self.ready and bool(self.address)
