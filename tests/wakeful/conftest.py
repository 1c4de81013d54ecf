"""The control plane as one piece, in-process on the memory store, on a free loopback port."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from wakeful.activator.settings import ActivatorSettings
from wakeful.bootstrap import ControlPlane, control_plane
from wakeful.store import Store, open_store
from wakeful.store.testing import free_port

TOKEN = "control-token"


@dataclass
class Running:
    store: Store
    plane: ControlPlane
    url: str
    token: str = TOKEN


@contextlib.asynccontextmanager
async def running_control_plane(
    data_dir: Path, *, artifact_clock: Callable[[], float] = time.time, **settings: float
) -> AsyncIterator[Running]:
    """Every router, the real activator and pool controller; no idle monitor, no node.
    `settings`: ActivatorSettings fields (`artifact_grace`, ...)."""
    listen = f"127.0.0.1:{free_port()}"
    config = ActivatorSettings(store_url="memory://", token=TOKEN, listen=listen, **settings)
    async with (
        open_store("memory://") as store,
        control_plane(store, config, data_dir, idle=None, artifact_clock=artifact_clock) as plane,
    ):
        yield Running(store, plane, f"http://{listen}")
