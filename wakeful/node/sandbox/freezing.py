"""A ready sandbox frozen and thawed as its record asks (the suspended tier): `suspended`
freezes it, anything else thaws it.

The agent's watch calls `want` with each record; `follow`, running beside the ready sandbox,
carries the changes out one at a time, in order, so a thaw never overtakes the freeze before
it. A stop thaws the sandbox itself (`SandboxProcess.stop`): a freeze that ends after a stop
was asked for is not counted.
"""

from __future__ import annotations

import logging

import anyio

from wakeful.aio import trace

from .runtime import SandboxProcess

log = logging.getLogger(__name__)


class Freezing:
    def __init__(self, sandbox_id: str, app: str, stop_requested: anyio.Event) -> None:
        self._sandbox_id = sandbox_id
        self._app = app
        self._stop_requested = stop_requested
        self._want = False
        self._changed = anyio.Event()
        self.since: float | None = None
        """When (node monotonic clock) it was frozen; None while it is not (the suspended
        tier: the activator wrote it `suspended`, `want`)."""
        self.held = 0
        """Bytes it held when frozen."""

    def want(self, frozen: bool) -> None:
        """Its record says `suspended` (freeze it) or anything else (thaw it): followed in
        order by `follow` once the sandbox is ready."""
        if frozen != self._want:
            self._want = frozen
            self._changed.set()
            if not frozen:
                trace.mark("thaw_seen", self._app)

    async def follow(self, process: SandboxProcess) -> None:
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            want = self._want
            if want and self.since is None:
                self.held = await process.freeze()
                if self._stop_requested.is_set():
                    return  # the stop thawed it (or it never froze)
                self.since = anyio.current_time()
                log.info("froze sandbox", extra={"sandbox": self._sandbox_id, "bytes": self.held})
            elif not want and self.since is not None:
                await process.thaw()
                trace.mark("unfrozen", self._app)
                self.since = None
                log.info("thawed sandbox", extra={"sandbox": self._sandbox_id})
