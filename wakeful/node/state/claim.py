"""One stateful sandbox's hold on its app's state, from its claim to its hand-back.

Claimed as the sandbox is prepared (`StateHold.claim`: the state must be held here for it);
marked restored once the app started on it, durably, beside its tree (`tree.RESTORED`); handed
back once the sandbox has ended and been reported, archived from its tree only when it was
restored there (else nothing newer than the state's own archive exists). The hand-back is
shielded and bounded; what a store outage interrupts, the agent's `StateHold.settle` finishes
from the archive saved on this node.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio

from wakeful.node.sandbox.workdir import StateLayer
from wakeful.store import StoreError

from .hold import StateHold
from .tree import mark_restored

log = logging.getLogger(__name__)
HAND_BACK_BOUND = 60.0
"""Seconds a stopping stateful sandbox spends archiving, storing and releasing its state
before the agent's `StateHold.settle` takes over (from the archive saved on this node)."""


class StateClaim:
    def __init__(self, states: StateHold, sandbox_id: str, app: str, epoch: int, path: str):
        self._states = states
        self._sandbox_id = sandbox_id
        self._app = app
        self._epoch = epoch
        self._path = path
        self._restored = False
        """Its state was placed in its tree and the app started (`tree.RESTORED`)."""

    @classmethod
    async def take(
        cls, states: StateHold, app: str, sandbox_id: str, path: str
    ) -> tuple[StateClaim, StateLayer]:
        """The claim, and the state to place at `path` in the sandbox's tree; `StateRefused`
        when it cannot have it."""
        epoch, layer = await states.claim(app, sandbox_id, path)
        return cls(states, sandbox_id, app, epoch, path), layer

    async def restored(self, base: Path) -> None:
        """The app started on its state: its tree holds it now, and what ends it archives it.
        The mark a restarted agent salvages this tree by goes in the sandbox's directory
        `base`; without it only a crash of the agent costs more: the next run hands the state
        back unchanged."""
        self._restored = True
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(mark_restored, base, self._path)
            except OSError as exc:
                log.warning(
                    "cannot mark the restored state: %s", exc, extra={"sandbox": self._sandbox_id}
                )

    async def hand_back(self, app_dir: Path | None) -> None:
        """Archive the state from the ended process's tree `app_dir` (None: no process was
        started), unchanged when it was not restored there, and release it."""
        tree = app_dir if self._restored else None
        with anyio.CancelScope(shield=True), anyio.move_on_after(HAND_BACK_BOUND):
            try:
                await self._states.hand_back(self._app, self._epoch, tree, self._path)
            except (StoreError, OSError) as exc:  # unavailable: `settle` finishes it
                log.warning(
                    "could not hand back the state of %s yet: %s",
                    self._app,
                    exc,
                    extra={"sandbox": self._sandbox_id},
                )
            except Exception:  # one sandbox's failure must not end the agent
                log.exception("handing back the state failed", extra={"sandbox": self._sandbox_id})
