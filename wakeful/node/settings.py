from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from wakeful.domain.models import parse_size
from wakeful.node.jail.uids import UID_BASE, UID_COUNT
from wakeful.node.tunnel.url import parse_url
from wakeful.store.settings import StoreSettings


def memory_share(text: str, total: int) -> int:
    """`25%` of `total`, or a size (`2Gi`, `512Mi`, bytes) -> bytes."""
    text = text.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 100:
            raise ValueError(f"{text!r} is not a share of memory (write e.g. 25%)")
        return int(total * share / 100)
    return parse_size(text)


def _default_name() -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")
    return name[:63] or "node"


class NodeSettings(StoreSettings):
    node_name: str = Field(
        default_factory=_default_name, pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
    )
    node_address: str = "127.0.0.1"
    """The address other machines reach this node's sandboxes at."""
    capacity: int = Field(default=100, ge=1)
    node_ttl: int = Field(default=10, ge=2, le=300)
    """Seconds without a keep-alive after which the node counts as dead."""
    data_dir: Path = Path(".wakeful")
    port_range: tuple[int, int] = (20000, 29999)
    """Ports handed to sandboxes: below Linux's ephemeral range (32768-60999), so no outgoing
    connection takes one between the pick and the app's bind. WAKEFUL_PORT_RANGE=[low,high]."""

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        """Resolved against the current directory once, at start."""
        return value.absolute()

    @field_validator("port_range")
    @classmethod
    def _sane_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"must be [low, high] within 1024-65535 (got {list(value)})")
        return value

    sandbox_uids: tuple[int, int] = (UID_BASE, UID_BASE + UID_COUNT - 1)
    """The uids this agent gives apps (as root), first and last: a part of 400000-499999,
    which the network rules know as sandboxes'. Agents that cannot see each other's claims
    (node containers whose root is the host's, docker-compose.yml) each take a part of their
    own. WAKEFUL_SANDBOX_UIDS=[400000,449999]."""

    @field_validator("sandbox_uids")
    @classmethod
    def _uid_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        first, last = value
        top = UID_BASE + UID_COUNT - 1
        if not UID_BASE <= first <= last <= top:
            raise ValueError(f"must be [first, last] within {UID_BASE}-{top} (got {list(value)})")
        return value

    stop_grace: float = Field(default=10.0, gt=0)
    shutdown_drain: float = Field(default=2.0, ge=0, le=600)
    """When the agent stops: seconds between taking its sandboxes out of admission and
    stopping them, for the requests already on them (0 when no ingress can still send any)."""
    log_ship_interval: float = Field(default=1.0, gt=0, le=60)
    """Seconds between batches of sandbox output pushed to the control plane."""
    log_buffer_bytes: int = Field(default=256 * 1024, ge=4096, le=64 * 1024 * 1024)
    """Output per sandbox held while the control plane is unreachable; past it the oldest
    bytes are dropped (and counted)."""
    isolation: Literal["bwrap", "none"] = "bwrap"
    """`bwrap`: every sandbox in its own namespaces, uid and limits (wakeful.node.jail.bwrap);
    the agent refuses to start without bubblewrap. `none` runs apps as the agent's own user,
    able to read everything it can: for trusted code only, and logged at every start."""
    image_cache: int = Field(default=10 << 30, ge=64 << 20, le=1 << 42)
    """Bytes of unpacked images kept on this node (`wakeful.node.images`); past it, trees no
    sandbox uses go, least recently used first. WAKEFUL_IMAGE_CACHE (bytes, or 10Gi)."""
    image_max_bytes: int = Field(default=4 << 30, ge=1 << 20, le=1 << 40)
    """The most one blob of an image may weigh, as fetched. WAKEFUL_IMAGE_MAX_BYTES (bytes, or
    4Gi), as the control plane bounds an image's layers with it."""
    image_max_unpacked: int = Field(default=4 << 30, ge=1 << 20, le=1 << 40)
    """The most one image may unpack to, from its layers' headers: past it, it is refused,
    whatever it weighed compressed. WAKEFUL_IMAGE_MAX_UNPACKED, the control plane's bound at
    deploy too: give both the same value."""
    image_max_files: int = Field(default=500_000, ge=100, le=50_000_000)
    """The most files one image may unpack to. WAKEFUL_IMAGE_MAX_FILES."""
    warm_slots: int = Field(default=2, ge=0, le=64)
    """Sandbox starters kept ready in their cgroups, so a cold start skips the kernel's slow
    cgroup join (~10-30 ms here; wakeful.node.sandbox.slots). ~8 MB each; 0 turns them off.
    Used only where the agent writes cgroups (root, isolation on). WAKEFUL_WARM_SLOTS."""
    sandbox_refused_networks: tuple[str, ...] = ()
    """Networks no sandbox may reach (CIDRs, e.g. a private network with databases apps must
    not see), besides this machine, the control plane and the other nodes, which are always
    refused (as root with nftables). WAKEFUL_SANDBOX_REFUSED_NETWORKS='["10.0.0.0/8"]'."""

    @field_validator("image_cache", "image_max_bytes", "image_max_unpacked", mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("sandbox_refused_networks")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"not a network (CIDR): {network!r}") from None
            if "%" in network:  # nft takes no IPv6 zone: the whole rule set would fail
                raise ValueError(f"a network with a zone (%...) cannot be refused: {network!r}")
        return value

    def refused_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(n, strict=False) for n in self.sandbox_refused_networks]

    state_max_bytes: int = Field(default=256 << 20, ge=1 << 20, le=64 << 30)
    """The largest state archive (an app's `[state]` directory, packed) this node stores when
    the app stops; past it the archive stays on this node and the state is not handed on
    (`wakeful nodes` names it). The control plane has the same bound. WAKEFUL_STATE_MAX_BYTES."""
    tunnel: str | None = None
    """Dial out instead of being dialed: the URL of the load balancer in front of the ingress
    replicas' tunnel listeners (`https://edge.example/`, or `http://HOST:PORT` on a private
    network). The node opens streams there with its node token and serves its sandboxes over
    them (wakeful.node.tunnel); nothing needs to reach this machine. WAKEFUL_TUNNEL."""
    tunnel_ca: Path | None = None
    """A PEM bundle that verifies the tunnel's TLS certificate (default: the system's
    roots). WAKEFUL_TUNNEL_CA."""
    tunnel_streams_max: int = Field(default=2048, ge=2, le=65_536)
    """Streams this node holds over every ingress replica, at most (seed 003).
    WAKEFUL_TUNNEL_STREAMS_MAX."""
    tunnel_streams_per_replica: int = Field(default=1024, ge=2, le=65_536)
    """Streams this node holds on one ingress replica, at most (the replicas enforce their
    own cap, `WAKEFUL_TUNNEL_STREAMS_PER_NODE`). WAKEFUL_TUNNEL_STREAMS_PER_REPLICA."""

    tunnel_prune_unused: float = Field(default=600.0, ge=1, le=86_400)
    """An idle stream unused this long is closed (down to each replica's reserve).
    WAKEFUL_TUNNEL_PRUNE_UNUSED."""
    tunnel_prune_min_age: float = Field(default=120.0, ge=0, le=86_400)
    """...and only once it is this old. WAKEFUL_TUNNEL_PRUNE_MIN_AGE."""

    @field_validator("tunnel")
    @classmethod
    def _tunnel_url(cls, value: str | None) -> str | None:
        if value:
            parse_url(value)  # refused here, naming the value, not when the agent runs
        return value or None

    suspended_memory: str = "25%"
    """The most memory suspended (frozen) sandboxes may hold on this node: a size (`2Gi`,
    bytes) or a share of the machine's memory (`25%`). Past it, or while the machine has less
    than `suspended_memory_floor` available, the longest suspended are stopped (their pools
    shrink by one each). WAKEFUL_SUSPENDED_MEMORY."""
    suspended_memory_floor: str = "5%"
    """Memory pressure, for the suspended tier: less than this available (MemAvailable), as a
    size or a share of the machine's memory. WAKEFUL_SUSPENDED_MEMORY_FLOOR."""

    @field_validator("suspended_memory", "suspended_memory_floor")
    @classmethod
    def _memory_share(cls, value: str) -> str:
        memory_share(value, 1 << 30)  # refused here, naming the value
        return value

    sandbox_paths: tuple[Path, ...] = ()
    """Directories shown read-only inside every sandbox besides /usr, /etc and the /lib ones
    (e.g. an interpreter installed under /opt). WAKEFUL_SANDBOX_PATHS='["/opt/python"]'."""
