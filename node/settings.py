from __future__ import annotations

import re
import socket
from pathlib import Path

from pydantic import Field

from wakeful.settings import StoreSettings


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
    stop_grace: float = Field(default=10.0, gt=0)
    shutdown_drain: float = Field(default=2.0, ge=0, le=600)
    """When the agent stops: seconds between taking its sandboxes out of admission and
    stopping them, for the requests already on them (0 when no ingress can still send any)."""
