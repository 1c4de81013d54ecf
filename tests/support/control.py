"""The control plane as one piece, in-process, on a free loopback port."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wakeful.activator.settings import ActivatorSettings
from wakeful.bootstrap import ControlPlane, control_plane
from wakeful.serving import AddressInUse
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
    data_dir: Path,
    *,
    artifact_clock: Callable[[], float] = time.time,
    store: Store | None = None,
    store_url: str = "memory://",
    replace_admin: bool = False,
    write_admin: Callable[[str], str] | None = None,
    token: str = TOKEN,
    **settings: Any,
) -> AsyncIterator[Running]:
    """Every router, the real activator and pool controller; no idle monitor, no node.
    `store`: an open store to run on (one that outlives this control plane), else one opened
    from `store_url`. `token` bootstraps the admin token. `settings`: ActivatorSettings fields
    (`artifact_grace`, ...). A port found free can be taken before the API binds it (by any
    process's outgoing connection): then, and only then, it starts again on another."""
    for attempt in range(3):
        listen = f"127.0.0.1:{free_port()}"
        config = ActivatorSettings(store_url="memory://", token=token, listen=listen, **settings)
        stack = contextlib.AsyncExitStack()
        try:
            running = store
            if running is None:
                running = await stack.enter_async_context(open_store(store_url))
            plane = await stack.enter_async_context(
                control_plane(
                    running,
                    config,
                    data_dir,
                    idle=None,
                    artifact_clock=artifact_clock,
                    replace_admin=replace_admin,
                    write_admin=write_admin,
                )
            )
        except BaseException as exc:
            await stack.aclose()
            if attempt < 2 and address_in_use(exc):
                continue
            raise
        async with stack:
            yield Running(running, plane, f"http://{listen}", token)
        return


def address_in_use(exc: BaseException) -> bool:
    """`exc` is, or a group holding it is, the API's port taken (`AddressInUse`)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(address_in_use(inner) for inner in exc.exceptions)
    return isinstance(exc, AddressInUse)
