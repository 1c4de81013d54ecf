"""A stateful app's state on this node: restored when its sandbox starts, archived and handed
back when it stops (design/stateful-apps-and-evacuation.md, incident 002).

Theory of operation:
- The pool controller adopts the state (`states/{app}`) for the sandbox it places here, in the
  same transaction that creates the sandbox's record. `claim` checks that this node holds it
  for that sandbox, fetches its latest archive from the control plane's blob store and checks
  its sha256: an archive that does not match is refused, never restored, and the state is
  handed back unchanged with the reason (the app does not start on an empty state).
- When the sandbox's process has ended, `hand_back` packs its state directory (never through
  a symbolic link: an app cannot make the agent archive a host path), writes the archive to
  `<data dir>/states/` (temporary file, fsync, rename), stores it with the control plane and
  releases the state with the archive's digest; only then is the local copy deleted. The node
  never writes `states/` itself: its `Keeper` (the control plane, in process or through the
  control API) stores and releases only what this node holds at the epoch it names, by
  compare-and-set on (node, epoch) (`wakeful.deploy.states`). A release that finds the state
  moved (this node was presumed dead and it was taken back) writes nothing.
- Nothing is released without its latest archive. An archive over the bound, one the blob
  store refuses, or a directory that cannot be read or saved stays on this node (set aside in
  `<data dir>/kept-states/`) and the state stays held here, `kept` with the reason in its
  record (`wakeful nodes` shows it). An archive the blob store could not take *now* stays in
  `<data dir>/states/`, the state held here but not `kept`, and `settle` tries again.
- A tree whose restore did not finish (no `restored` mark beside it) holds no state worth
  keeping: its state is handed back unchanged.
- `salvage`, when the agent starts (before the previous run's sandbox directories are
  cleared), packs what a killed agent left: the state directory of each state this node holds
  whose sandbox had been restored and is not about to start. `settle` (every few seconds)
  hands back every state this node holds whose sandbox no runner of this run has and whose
  record is gone or finished (a transaction on that record's revision), from its local archive
  when there is one. So a kill at any step leaves the state either held here (and handed back
  by the next run) or released with its latest archive.

The archives on this node are `archives.LocalArchives`'s; a tree's state directory and its
`restored` mark are read through `tree`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Protocol, TypeVar

import anyio

from wakeful.aio import failpoints
from wakeful.aio.backoff import retry
from wakeful.domain import keys, state
from wakeful.domain.artifacts import ArtifactError, digest_of
from wakeful.domain.backoff import Backoff
from wakeful.domain.models import FINISHED, AppState, Sandbox, SandboxStatus
from wakeful.node.sandbox.workdir import Artifacts, StateLayer, sandbox_dir, verify
from wakeful.store import Item, Store, StoreError

from .archives import LocalArchives
from .tree import left_tree, restored_path, state_source

log = logging.getLogger(__name__)
TRIES = 4
"""Tries to fetch or store an archive while the blob store is unavailable (backing off)."""
FETCH_BACKOFF = Backoff(0.5)
"""Between those tries."""
T = TypeVar("T")


class Keeper(Protocol):
    """What a node asks of the control plane for the states it holds, each call naming the
    epoch it holds the state at: store an archive, release the state (with it), keep it. A
    release or keep returns what was written, the refusal (`state.Stale`: nothing written),
    or None (the record is gone, or `sandbox_at`, a sandbox id and the revision its record
    was read at, no longer holds). `store` raises `ArtifactError` when refused for good and
    `ArtifactUnavailable` (an `OSError`) when it cannot be done now."""

    async def store(self, app: str, epoch: int, data: bytes, digest: str) -> None: ...

    async def release(
        self,
        app: str,
        epoch: int,
        *,
        archive: str | None = None,
        size: int = 0,
        error: str = "",
        sandbox_at: tuple[str, int] | None = None,
    ) -> AppState | state.Stale | None: ...

    async def keep(
        self, app: str, epoch: int, error: str, *, for_good: bool = True
    ) -> AppState | state.Stale | None: ...


class StateRefused(Exception):
    """The sandbox cannot have its state; the message says why (its `last_log`)."""


class StateHold:
    def __init__(
        self,
        store: Store,
        artifacts: Artifacts,
        keeper: Keeper,
        node: str,
        data_dir: Path,
        max_bytes: int,
    ) -> None:
        """`store`: read only (`states/`, `sandboxes/`); every write goes through `keeper`."""
        self._store = store
        self._artifacts = artifacts
        self._keeper = keeper
        self._node = node
        self._data_dir = data_dir
        self._archives = LocalArchives(data_dir, max_bytes)
        self._in_hand: set[str] = set()
        """Local archive names of states a runner of this run holds (claimed, not yet handed
        back): `settle`'s clean-up never touches them, whatever its listing said."""
        self.tries = TRIES
        """Tries to fetch or store an archive before giving up for now."""
        self.conflicts = 0
        """Releases refused because the state had moved (this node had lost it)."""

    # -- start ----------------------------------------------------------------------------------

    async def claim(self, app: str, sandbox_id: str, path: str) -> tuple[int, StateLayer]:
        """The epoch this node holds the app's state at for `sandbox_id`, and the state to
        place at `path` in its tree. `StateRefused` when it is not held here for it, when its
        archive does not match its sha256 (then it is handed back, refused), or when the blob
        store cannot be reached (then `settle` hands it back once the sandbox has ended)."""
        item = await self._store.get(keys.state(app), AppState)
        if item is None or item.value.node != self._node or item.value.sandbox != sandbox_id:
            where = "nobody" if item is None else state.holder(item.value)
            raise StateRefused(f"the state of app {app!r} is held by {where}, not for {sandbox_id}")
        record = item.value
        self._in_hand.add(self._archives.path(app, record.epoch).name)
        if record.archive is None:
            return record.epoch, StateLayer(path)
        digest = record.archive
        failpoints.reach("state-before-restore")
        try:
            data = await self._retried(lambda: self._artifacts.fetch(digest))
            await anyio.to_thread.run_sync(verify, data, digest)
        except ArtifactError as exc:
            self._in_hand.discard(self._archives.path(app, record.epoch).name)
            reason = f"its state archive was refused, not restored: {exc}"
            await self._release(app, record.epoch, error=reason)
            raise StateRefused(reason) from exc
        except OSError as exc:
            self._in_hand.discard(self._archives.path(app, record.epoch).name)
            raise StateRefused(f"its state archive cannot be fetched now: {exc}") from exc
        return record.epoch, StateLayer(path, data, digest, checked=True)

    async def _retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, tried again (backing off) while it raises `OSError` (unavailable)."""
        return await retry(call, FETCH_BACKOFF, errors=(OSError,), tries=self.tries)

    # -- stop -----------------------------------------------------------------------------------

    async def hand_back(self, app: str, epoch: int, tree: Path | None, path: str) -> None:
        """Archive the state at `path` in the ended sandbox's `tree` (None: it never ran, or its
        restore did not finish, so nothing newer than the state's own archive exists), store
        the archive and release the state held at `epoch`."""
        try:
            if tree is None:
                await self._release(app, epoch)
                return
            failpoints.reach("state-before-archive")
            try:
                source = state_source(tree, path)
            except ArtifactError as exc:  # the app's doing: its last archive stays the state
                log.warning("the state of %s: %s", app, exc, extra={"node": self._node})
                await self._release(app, epoch, error=str(exc))
                return
            await self._archive(app, epoch, source)
        finally:
            self._in_hand.discard(self._archives.path(app, epoch).name)

    async def _archive(self, app: str, epoch: int, source: Path) -> None:
        try:
            data = await anyio.to_thread.run_sync(self._archives.pack, source)
            local = await anyio.to_thread.run_sync(self._archives.save, app, epoch, data)
        except (ArtifactError, OSError) as exc:
            await self._cannot_archive(app, epoch, source, str(exc))
            return
        failpoints.reach("state-after-archive")
        await self._store_and_release(app, epoch, local, data)

    async def _cannot_archive(self, app: str, epoch: int, source: Path, why: str) -> None:
        """Keep the state here, with a copy set aside, if a copy can be made; else nothing of
        what the sandbox wrote can be had, and the state goes back at its last archive."""
        kept = await anyio.to_thread.run_sync(self._archives.set_aside, source, app, epoch)
        if kept is None:
            await self._release(
                app,
                epoch,
                error=f"its state was not archived ({why}) and no copy of it could be kept "
                "(too large, or unreadable): the app goes on from its last archive",
            )
            return
        await self._keep(app, epoch, f"its state was not archived ({why}); kept in {kept}")

    async def _store_and_release(
        self,
        app: str,
        epoch: int,
        local: Path,
        data: bytes,
        sandbox_at: tuple[str, int] | None = None,
    ) -> None:
        digest = await anyio.to_thread.run_sync(digest_of, data)
        try:
            await self._retried(lambda: self._keeper.store(app, epoch, data, digest))
        except ArtifactError as exc:  # refused for good: trying again will not help
            aside = await anyio.to_thread.run_sync(self._archives.move_aside, local)
            await self._keep(app, epoch, f"its archive was refused: {exc}; kept in {aside}")
            return
        except OSError as exc:  # in hand: `settle` tries again; no operator is needed
            await self._keep(
                app,
                epoch,
                f"its archive could not be stored yet: {exc}; saved on node {self._node}, "
                "handed on when the blob store takes it",
                for_good=False,
            )
            return
        if await self._release(app, epoch, archive=digest, size=len(data), sandbox_at=sandbox_at):
            await anyio.Path(local).unlink(missing_ok=True)

    async def _release(
        self,
        app: str,
        epoch: int,
        *,
        archive: str | None = None,
        size: int = 0,
        error: str = "",
        sandbox_at: tuple[str, int] | None = None,
    ) -> AppState | None:
        """Release; the record written, or None when it had moved (or is gone, or the sandbox
        at `sandbox_at` moved on). A local archive of a state this node no longer holds is of
        no use: deleted."""
        written = await self._keeper.release(
            app, epoch, archive=archive, size=size, error=error, sandbox_at=sandbox_at
        )
        if not isinstance(written, AppState):
            if isinstance(written, state.Stale):  # no longer ours: maybe the only copy of it
                self._refused(written)
                local = self._archives.path(app, epoch)
                if await anyio.Path(local).exists():
                    aside = await anyio.to_thread.run_sync(self._archives.move_aside, local)
                    log.error(
                        "the state of %s moved on without this node's archive; kept in %s",
                        app,
                        aside,
                        extra={"node": self._node},
                    )
            return None
        failpoints.reach("state-after-release")
        await anyio.Path(self._archives.path(app, epoch)).unlink(missing_ok=True)
        log.info(
            "handed back the state of %s at epoch %d%s",
            app,
            epoch,
            "" if archive is None else f" with archive {archive[:12]} ({size} bytes)",
            extra={"node": self._node},
        )
        return written

    async def _keep(self, app: str, epoch: int, error: str, *, for_good: bool = True) -> None:
        """Hold the state here with the reason: `for_good`, until an operator acts (`kept`);
        otherwise only until `settle` manages to hand it back."""
        log.error("keeping the state of %s here: %s", app, error, extra={"node": self._node})
        written = await self._keeper.keep(app, epoch, error, for_good=for_good)
        if isinstance(written, state.Stale):
            self._refused(written)

    def _refused(self, stale: state.Stale) -> None:
        self.conflicts += 1
        log.warning("the state was not written: %s", stale.reason, extra={"node": self._node})

    # -- what a previous run left, and what nobody uses -----------------------------------------

    async def salvage(self, sandboxes: list[Item[Sandbox]]) -> None:
        """Before a restarted agent clears its sandbox directories: pack the state directory
        of each state this node holds whose sandbox had been restored and is not about to
        start (and has no local archive yet), so `settle` hands it back with what the app last
        wrote. A state that cannot be packed is set aside and kept, with the reason."""
        records = {item.value.id: item.value for item in sandboxes}
        for item in (await self._store.list(keys.STATES, AppState)).items:
            held = item.value
            if held.node != self._node or held.sandbox is None:
                continue
            sandbox = records.get(held.sandbox)
            if sandbox is not None and sandbox.status is SandboxStatus.PENDING:
                continue  # started (and restored) by this run
            if self._archives.path(held.app, held.epoch).exists():
                continue
            base = sandbox_dir(self._data_dir, held.sandbox)
            path, tree = restored_path(base), left_tree(base)
            if path is None or tree is None:
                continue  # nothing newer than its archive: `settle` releases it unchanged
            try:
                source = state_source(tree, path)
            except ArtifactError as exc:  # the app's doing: its last archive stays the state
                await self._release(held.app, held.epoch, error=str(exc))
                continue
            try:
                data = await anyio.to_thread.run_sync(self._archives.pack, source)
                await anyio.to_thread.run_sync(self._archives.save, held.app, held.epoch, data)
            except (ArtifactError, OSError) as exc:
                await self._cannot_archive(held.app, held.epoch, source, str(exc))
                continue
            log.info("salvaged the state of %s left by the previous run", held.app)

    async def settle(self, in_use: Callable[[], Collection[str]]) -> None:
        """Hand back every state this node holds whose sandbox no runner of this run has
        (`in_use`, asked again before each) and whose record is gone or finished: from its
        local archive when there is one, else unchanged (nothing newer than its archive exists
        here). The release requires the sandbox record as read, so a sandbox that started
        meanwhile keeps its state."""
        held_here = set()
        records = (await self._store.list(keys.STATES, AppState)).items
        for item in records:
            held = item.value
            if held.node != self._node:
                continue
            held_here.add(self._archives.path(held.app, held.epoch).name)
            if held.sandbox in in_use():
                continue
            found = None
            if held.sandbox is not None:
                found = await self._store.get(keys.sandbox(held.sandbox), Sandbox)
                if found is not None and found.value.status not in FINISHED:
                    continue  # about to start here, starting, or running
            if held.sandbox in in_use():
                continue
            sandbox_at = (
                None
                if held.sandbox is None
                else (held.sandbox, 0 if found is None else found.revision)
            )
            local = self._archives.path(held.app, held.epoch)
            if local.exists():
                data = await anyio.Path(local).read_bytes()
                await self._store_and_release(held.app, held.epoch, local, data, sandbox_at)
            elif not held.kept:  # kept with no archive here: an operator's to act on
                await self._release(held.app, held.epoch, sandbox_at=sandbox_at)
        released = {f"{i.value.app}.{i.value.archived_epoch}.tar.gz" for i in records}
        await anyio.to_thread.run_sync(
            self._archives.forget_stale, held_here, released, self._in_hand
        )

    async def run(self, in_use: Callable[[], Collection[str]], interval: float = 5.0) -> None:
        """`settle` every `interval` seconds; a store or blob store that is down only delays it."""
        while True:
            try:
                await self.settle(in_use)
            except (StoreError, OSError) as exc:
                log.warning("cannot settle held states now: %s", exc)
            await anyio.sleep(interval)
