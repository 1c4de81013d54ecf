"""The control plane as one piece, in-process on the memory store, on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
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
async def running_control_plane(data_dir: Path) -> AsyncIterator[Running]:
    """Every router, the real activator and pool controller; no idle monitor, no node."""
    listen = f"127.0.0.1:{free_port()}"
    settings = ActivatorSettings(store_url="memory://", token=TOKEN, listen=listen)
    async with (
        open_store("memory://") as store,
        control_plane(store, settings, data_dir, idle=None) as plane,
    ):
        yield Running(store, plane, f"http://{listen}")
