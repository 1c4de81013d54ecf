"""The data model: what lives in the store, one pydantic model per kind of key.

Every model validates on construction and on load, so a value read back from the store is
as trustworthy as one built in code. Validation errors name the field and the value that
was refused (`describe_validation_error`).

| key                         | model    |
|-----------------------------|----------|
| `apps/{app}`                | App      |
| `versions/{app}/{version}`  | Version  |
| `pools/{pool}`              | Pool     |
| `sandboxes/{id}`            | Sandbox  |
| `nodes/{node}`              | Node     |
| `cordons/{node}`            | Cordon   |
| `seen/{node}`               | SeenNode |
| `tokens/{name}`             | Token    |
| `states/{app}`              | AppState |
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""App, version, pool and node names: DNS labels, so `<app>.<domain>` is always a host."""

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
HOST_PATTERN = r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
Host = Annotated[str, StringConstraints(pattern=HOST_PATTERN, max_length=253)]
SANDBOX_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,127}$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV = frozenset({"PORT", "HOST"})


class Model(BaseModel):
    """Base for stored values: unknown fields are refused, values are immutable, and a float
    is a finite number (JSON has no infinity: `-1e999` written to etcd by a hostile node would
    otherwise reach every reader, the dashboard's browsers included, as one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class HealthCheck(Model):
    """How a sandbox is judged ready: an HTTP GET of `path`, or a TCP connect when absent."""

    path: Annotated[str, StringConstraints(pattern=r"^/[^\s]*$", max_length=1024)] | None = None
    timeout: float = Field(default=30.0, gt=0, le=3600, description="seconds to become ready")


class Concurrency(Model):
    """How a pool is sized.

    `auto`: `requests_per_instance` is a scaling target (not an admission cap); the pool
    grows with demand and shrinks when idle. `fixed`: the pool keeps exactly
    `min_instances` (= `max_instances`) sandboxes. `hard_limit`, when set, is an admission cap
    per sandbox in either mode (Knative's containerConcurrency).
    """

    mode: Literal["auto", "fixed"] = "auto"
    requests_per_instance: int = Field(default=10, ge=1, le=10_000)
    scale_down_delay: float = Field(
        default=300.0,
        ge=5,
        le=86_400,
        description="seconds without traffic before a sandbox counts as idle (traffic is "
        "reported every 2 s, so shorter delays would stop busy sandboxes)",
    )
    suspend_delay: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="seconds without traffic (and with no lease on it) before a running "
        "sandbox is frozen: it keeps its memory and its port, uses no CPU, and wakes in "
        "milliseconds; 0 turns the suspended tier off (at least 1 otherwise)",
    )
    min_instances: int = Field(default=0, ge=0, le=1000)
    max_instances: int = Field(default=20, ge=1, le=1000)
    hard_limit: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="requests one sandbox may carry at once; past it on every sandbox a "
        "request waits (bounded) for room or a new sandbox. None: no cap",
    )

    @field_validator("scale_down_delay", "suspend_delay", mode="before")
    @classmethod
    def _no_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # pydantic would take true as 1 second
            raise ValueError("must be a number of seconds or a duration such as 30s")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.hard_limit is not None and self.hard_limit < self.requests_per_instance:
            raise ValueError(
                f"hard_limit ({self.hard_limit}) must be at least requests_per_instance "
                f"({self.requests_per_instance}): the target has to fit under the cap"
            )
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"min_instances ({self.min_instances}) must not exceed "
                f"max_instances ({self.max_instances})"
            )
        if self.mode == "fixed" and self.min_instances != self.max_instances:
            raise ValueError(
                "fixed mode keeps exactly one size: min_instances "
                f"({self.min_instances}) must equal max_instances ({self.max_instances})"
            )
        if self.mode == "fixed" and self.min_instances == 0:
            raise ValueError("fixed mode needs min_instances >= 1")
        if 0 < self.suspend_delay < 1:
            raise ValueError(
                f"suspend_delay ({self.suspend_delay:g}) must be 0 (no suspended tier) or at "
                "least 1 second"
            )
        return self


UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
SIZE = re.compile(r"^\s*(\d{1,12})\s*(Ki|Mi|Gi)?\s*$")
MIN_SIZE, MAX_SIZE = 16 << 20, 64 << 30


def parse_size(text: str | int) -> int:
    """`"256Mi"` -> bytes. Plain integers are bytes; Ki, Mi and Gi are powers of 1024."""
    if isinstance(text, int):
        return text
    found = SIZE.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a size (write e.g. 256Mi, 1Gi or a number of bytes)")
    return int(found.group(1)) * UNITS[found.group(2) or ""]


def format_size(size: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)


class Resources(Model):
    """What one sandbox may use. Enforced by the node: cgroups (memory, pids) where it can
    write them, rlimits otherwise; `open_files` is always an rlimit."""

    memory: int = Field(
        default=512 << 20,
        description="bytes, or a size such as 256Mi or 1Gi (16Mi to 64Gi); past it the "
        "sandbox is killed and reported as out of memory",
    )
    disk: int = Field(
        default=1 << 30,
        description="bytes the app may write into its own directory (16Mi to 64Gi); the "
        "directory is memory-backed where the node is root, so writes count against memory",
    )
    processes: int = Field(default=256, ge=8, le=65_536, description="processes and threads")
    open_files: int = Field(default=4096, ge=64, le=1_048_576)

    @field_validator("memory", "disk", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_size(value)
        return value

    @field_validator("memory", "disk")
    @classmethod
    def _size_bounds(cls, value: int) -> int:
        if not MIN_SIZE <= value <= MAX_SIZE:
            raise ValueError(
                f"must be between {format_size(MIN_SIZE)} and {format_size(MAX_SIZE)} "
                f"(got {format_size(value)})"
            )
        return value


STATE_PATH = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
"""A relative path inside the app's tree: plain names, no leading `/` (and no `.` or `..`
part, `StateSpec._inside`)."""


class StateSpec(Model):
    """`[state]` in wakeful.toml: a directory of the app's tree that outlives its sandbox.
    It is archived when the sandbox stops and restored when the app wakes, on any node."""

    path: Annotated[str, StringConstraints(pattern=STATE_PATH, max_length=255)] = Field(
        description="a directory inside the app's tree, e.g. data"
    )

    @field_validator("path")
    @classmethod
    def _inside(cls, path: str) -> str:
        if any(part in (".", "..") for part in path.split("/")):
            raise ValueError(f"{path!r} must name a directory inside the app's tree")
        return path


class AppSpec(Model):
    """What a user deploys: how to run the app and how to size it."""

    command: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=256
    )
    env: dict[str, Annotated[str, StringConstraints(max_length=32_768)]] = Field(
        default_factory=dict, max_length=512
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65_535,
        description="fixed port to listen on; by default a free port is passed in PORT",
    )
    health: HealthCheck = Field(default_factory=HealthCheck)
    concurrency: Concurrency = Field(default_factory=Concurrency)
    resources: Resources = Field(default_factory=Resources)
    shutdown_timeout: float = Field(default=10.0, gt=0, le=3600)
    activation_timeout: float = Field(default=120.0, gt=0, le=3600)
    state: StateSpec | None = None
    server_timing: bool = Field(default=False, strict=True)
    """Answers carry `Server-Timing` (queue, wake, upstream): it tells anyone whether the app
    was asleep, so it is off unless the app, or the ingress as a whole, turns it on."""

    @model_validator(mode="after")
    def _one_writer(self) -> Self:
        if self.state is not None and self.concurrency.max_instances != 1:
            raise ValueError(
                "state: an app with [state] runs one sandbox at a time, so it needs "
                f"concurrency.max_instances = 1 (got {self.concurrency.max_instances})"
            )
        return self

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"{name!r} is set by wakeful and cannot be overridden")
        return env


class App(Model):
    name: Name
    hosts: list[Host] = Field(default_factory=list, max_length=64)
    default_host: bool = True
    """Whether `<name>.<base_domain>` routes to it (`default_host = false` in wakeful.toml)."""
    active_version: Name | None = None
    previous_version: Name | None = None


class Version(Model):
    app: Name
    version: Name
    spec: AppSpec
    artifact: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    created_at: float = 0.0


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
    draining_since: float = 0.0
    """Wall-clock time the pool controller drained it (0: never drained)."""
    suspended_at: float = 0.0
    """Wall-clock time the activator suspended it (0 unless `suspended`): the longest
    suspended goes first when its node's memory cap is passed, and a scale-down stops
    suspended sandboxes before running ones."""

    @property
    def routable(self) -> bool:
        """Admission may place a request here: running, ready, addressed, not draining."""
        return self.status is SandboxStatus.RUNNING and self.ready and bool(self.address)


class ReplicaCoverage(Model):
    """A tunnelled node's streams on one ingress replica, as its last coverage tick saw them
    (`wakeful.domain.coverage`, seed 003)."""

    replica: str = Field(min_length=1, max_length=200)
    streams: int = Field(ge=0)
    busy: int = Field(ge=0)
    budget: int = Field(ge=0)
    state: str = Field(max_length=20)


class Tunnel(Model):
    """How a node that dials out is reached: through its streams on the ingress replicas.
    `reachable` is false while it holds no stream on any replica: then its sandboxes are out
    of admission (the activator grants nothing on capacity nobody can reach)."""

    reachable: bool = False
    replicas: list[ReplicaCoverage] = Field(default_factory=list, max_length=256)
    since: float = 0.0
    """When `reachable` last changed."""
    actions: dict[str, int] = Field(default_factory=dict, max_length=16)
    """Streams opened or closed by each coverage action since the agent started (grow,
    fill, evacuate, recycle, prune, cap)."""


class Frozen(Model):
    """A frozen sandbox and the bytes it holds, as measured when it was frozen (`Node.evict`)."""

    sandbox: str = Field(min_length=1, max_length=128)
    memory: int = Field(default=0, ge=0)

    @property
    def weight(self) -> int:
        """What giving it up counts for: its bytes, and at least 1 (one measured as 0, where
        nothing could be read, still counts, so none is given up for nothing)."""
        return max(1, self.memory)


class Node(Model):
    name: Name
    address: str
    capacity: int = Field(default=100, ge=0)
    cordoned: bool = False
    evacuating: bool = False
    isolation: str = Field(default="", max_length=500)
    """How this node isolates sandboxes, and what it cannot enforce (`Jail.describe`)."""
    tunnel: Tunnel | None = None
    """Set when the node dials out to the ingress tier instead of being dialed
    (`WAKEFUL_TUNNEL`); its sandboxes' addresses are then `tunnel://NODE/SANDBOX`."""
    suspended: int = Field(default=0, ge=0, le=100_000)
    """Sandboxes frozen on this node now."""
    suspended_memory: int = Field(default=0, ge=0)
    """Bytes they hold, as measured when each was frozen."""
    suspended_memory_cap: int = Field(default=0, ge=0)
    """The most they may hold (`WAKEFUL_SUSPENDED_MEMORY`); past it, or under memory pressure,
    the longest suspended are named in `evict`."""
    memory_pressure: bool = False
    """Less than `WAKEFUL_SUSPENDED_MEMORY_FLOOR` of the machine's memory is available: each
    pass asks for one frozen sandbox more."""
    evict_bytes: int = Field(default=0, ge=0)
    """How much of that memory this node asks to give up (0: nothing): past its cap, what
    brings it back under; under memory pressure, one sandbox more each pass."""
    evict: list[Frozen] = Field(default_factory=list, max_length=1000)
    """While `evict_bytes` is not 0, its frozen sandboxes, the longest suspended first: the
    activator stops the first it may, each with its pool shrunk by one in the same
    transaction, passing over those that must stay (`min_instances`), until they add up to
    `evict_bytes`. The node does not know pools; the activator does."""


class IngressReplica(Model):
    """An ingress replica that serves tunnels (`ingresses/{replica}`, bound to its TTL lease):
    where its peers relay a request for a node whose streams it holds."""

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    relay: str = Field(min_length=3, max_length=300)
    """host:port of its tunnel listener, as its peers dial it."""
    since: float = 0.0


Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class AppState(Model):
    """The state of an app with `[state]` (`states/{app}`): who holds it and its latest archive.

    Ownership moves only by compare-and-set on (node, epoch) (`wakeful.domain.state`): the pool
    controller adopts it for the sandbox it places (`node`, `sandbox` set, epoch + 1); the
    holding node releases it when that sandbox stops, with the archive it just stored (`node`
    cleared, epoch + 1). At rest (the app at zero) it belongs to no node. Only the digest lives
    here; the archive's bytes are in the control plane's blob store, beside the artifacts."""

    app: Name
    node: Name | None = None
    epoch: int = Field(default=0, ge=0)
    sandbox: str | None = Field(default=None, max_length=200)
    archive: Digest | None = None
    """sha256 of the latest archive (None: never archived; the app's files seed the state)."""
    size: int = Field(default=0, ge=0)
    archived_at: float = 0.0
    archived_epoch: int = Field(default=0, ge=0)
    """The epoch of the holder that wrote `archive`."""
    released_by: Name | None = None
    released_at: float = 0.0
    moved_from: Name | None = None
    """The node that held it before its current (or last) holder, when they differ."""
    moved_at: float = 0.0
    error: str = Field(default="", max_length=4000)
    """Why the last hand-off did not go as it should (cleared when it is adopted again)."""
    kept: bool = False
    """Its holder could not archive or store it and keeps it, with `error` saying where."""


class Cordon(Model):
    """An operator's drain of a node (`cordons/{node}`), kept apart from the node's own
    TTL-bound record so a re-registering agent cannot clear it. A cordoned node takes no new
    sandboxes; an evacuating one also has its sandboxes replaced elsewhere, then drained."""

    node: Name
    evacuate: bool = True
    since: float = 0.0
    by_agent: bool = False
    """Set by the node's own agent while it shuts down (cleared when it starts again);
    an operator's cordon stays until `wakeful drain NODE --undo`."""


class SeenNode(Model):
    """That a node has registered at least once (`seen/{node}`, no TTL, written by its agent
    when it registers). A drain names a node by hand: this tells a node whose agent is down
    from a typo."""

    name: Name
    first_seen: float = 0.0


class RolloutRecord(Model):
    """A deploy or rollback in progress, or how it ended (`rollouts/{app}/{version}`): what a
    control plane that takes over needs to carry it on, and what `wakeful deploy` reads."""

    app: Name
    version: Name
    pool: str
    phase: Literal["rolling", "live", "failed"]
    message: str = Field(default="", max_length=4000)
    target_ready: int = Field(default=0, ge=0)
    hosts: list[str] = Field(default_factory=list)
    default_host: bool = True
    started_at: float = 0.0
    """Wall-clock time it began: its deadline runs from here, whoever carries it on."""


class SessionKey(Model):
    """The key dashboard sessions are signed with (`ui/session-key`): shared by every control
    plane, so a session outlives a restart and a change of leader."""

    key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    created_at: float = 0.0


class Leader(Model):
    """Who holds a role that runs once cluster-wide (`leaders/{role}`, bound to the holder's
    TTL lease). Its revision fences the holder's writes (`wakeful.store.election`)."""

    holder: str = Field(min_length=1, max_length=200)
    url: str = Field(default="", max_length=2000)
    """Where the holder serves (the activator's control API), for those that follow it."""
    since: float = 0.0


class Role(StrEnum):
    """What a control API token may do: admin everything, node fetch artifacts and push logs,
    ingress take, renew and release leases (the route map: `wakeful.activator.roles`)."""

    ADMIN = "admin"
    NODE = "node"
    INGRESS = "ingress"


ADMIN_TOKEN = "admin"
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


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: `field.path: reason (got value)`."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "value"
        got = error.get("input")
        got_text = "" if isinstance(got, dict | list) else f" (got {got!r})"
        message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's, not ours
        lines.append(f"{where}: {message}{got_text}")
    return "; ".join(lines)
