"""The agent's side of the thaw guard (`thawguard.py`): one guard running for as long as the
agent can freeze sandboxes.

Started before anything of this run is frozen; one that ended (killed, say), or could not
start, is started again within `GUARD_EVERY`. Until then a frozen sandbox would outlive an agent
killed meanwhile. It is its own loop, so a slow store does not stretch that window. An agent
that stops cleanly closes it last, once nothing of its own is frozen.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio

from .thawguard import ThawGuard

log = logging.getLogger(__name__)
GUARD_EVERY = 0.5
"""Seconds between two looks at the thaw guard (`GuardKeeper.run`)."""


class GuardKeeper:
    """Keeps a `ThawGuard` over `sandboxes` (this agent's sandbox directories) and `freezer`
    (the freezer hierarchy's `wakeful/`) running."""

    def __init__(self, sandboxes: Path, freezer: Path) -> None:
        self._sandboxes = sandboxes
        self._freezer = freezer
        self._guard: ThawGuard | None = None

    def start(self) -> None:
        """Start the guard that thaws this run's frozen sandboxes if the agent dies without
        doing it."""
        try:
            self._guard = ThawGuard.start(self._sandboxes, self._freezer)
        except OSError as exc:  # a fork refused (pids, memory): `run` tries again
            self._guard = None
            log.warning("cannot start the guard that thaws frozen sandboxes: %s", exc)

    async def run(self) -> None:
        """Start the guard again, within `GUARD_EVERY`, whenever it is not running."""
        while True:
            await anyio.sleep(GUARD_EVERY)
            guard = self._guard
            if guard is not None:
                code = guard.ended()
                if code is None:
                    continue
                log.warning("the guard that thaws frozen sandboxes ended (exit code %s)", code)
            self.start()

    async def close(self) -> None:
        """End the guard (nothing of this agent's is frozen now) and reap it."""
        guard, self._guard = self._guard, None
        if guard is not None:
            code = await anyio.to_thread.run_sync(guard.close)
            if code != 0:
                log.warning("the guard that thaws frozen sandboxes ended with exit code %s", code)
