"""Nodes and how they are reached: a node's record (with its tunnel, for a node that dials out,
and the frozen sandboxes it asks to give up), an operator's cordon, that a node was ever seen,
and the ingress replicas that relay to a tunnelled node's streams.

| key                   | model          |
|-----------------------|----------------|
| `nodes/{node}`        | Node           |
| `cordons/{node}`      | Cordon         |
| `seen/{node}`         | SeenNode       |
| `ingresses/{replica}` | IngressReplica |
"""

from __future__ import annotations

from pydantic import Field

from wakeful.domain.models.base import Model, Name


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
    image_cache: ImageCacheUse | None = None
    """Its image cache (None: it runs no image apps)."""
    agent: str = Field(default="", max_length=200)
    """The agent holding the record (`wakeful.node.registration.agent_identity`: the
    machine's boot, its data directory's place on disk and an id kept there), so that another
    agent of the node (another directory, a copy of it, a cloned machine) is told from this
    one's next run (`claim`). Empty from an older agent."""


class ImageCacheUse(Model):
    """A node's image cache (`wakeful.node.images`), as `wakeful nodes` shows it."""

    images: int = Field(default=0, ge=0)
    """Unpacked trees (one per image and app)."""
    bytes: int = Field(default=0, ge=0)
    """Their files' bytes (bounded by `WAKEFUL_IMAGE_CACHE`)."""
    bound: int = Field(default=0, ge=0)
    hits: int = Field(default=0, ge=0)
    misses: int = Field(default=0, ge=0)


class IngressReplica(Model):
    """An ingress replica that serves tunnels (`ingresses/{replica}`, bound to its TTL lease):
    where its peers relay a request for a node whose streams it holds."""

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    relay: str = Field(min_length=3, max_length=300)
    """host:port of its tunnel listener, as its peers dial it."""
    since: float = 0.0


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
