"""A stateful app's state on this node: restored when its sandbox starts, archived and handed
back when it stops (design/stateful-apps-and-evacuation.md, incident 002).

Theory of operation:
- The pool controller adopts the state (`states/{app}`) for the sandbox it places here, in the
  same transaction that creates the sandbox's record. `claim` checks that this node holds it
  for that sandbox, fetches its latest archive from the control plane's blob store and checks
  its sha256: an archive that does not match is refused, never restored, and the state is
  handed back unchanged with the reason (the app does not start on an empty state).
- When the sandbox's process has ended, `hand_back` packs its state directory, writes the
  archive to `<data dir>/states/` (temporary file, fsync, rename), stores it in the blob store
  with the node's credential, and releases the state by compare-and-set on (node, epoch) with
  the archive's digest; only then is the local copy deleted. A release that finds the state
  moved (this node was presumed dead and it was taken back) writes nothing.
- Nothing is released without its latest archive. An archive over the bound, or one the blob
  store would not take, stays on this node and the state stays held here, with the reason in
  its record (`wakeful nodes` shows it); `settle` tries again.
- `salvage`, when the agent starts (before the previous run's sandbox directories are
  cleared), packs what a killed agent left: the state directory of each state this node holds
  whose sandbox is not about to start. `settle` (every few seconds) then hands back every state
  this node holds that no sandbox of this run is using, from its local archive when there is
  one. So a kill at any step leaves the state either held here (and handed back by the next
  run) or released with its latest archive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path

import anyio

from wakeful.domain import keys, state
from wakeful.domain.artifacts import ArtifactError, digest_of, pack
from wakeful.domain.models import AppState, Pool, Sandbox, SandboxStatus
from wakeful.store import Conflict, Item, Store, StoreError

from .workdir import Artifacts, StateLayer, sandbox_dir, verify

log = logging.getLogger(__name__)
UPLOAD_TRIES = 4
"""Tries to store an archive before the state is kept here (`settle` tries again later)."""
_LOCAL = re.compile(r"^([a-z0-9-]+)\.(\d+)\.tar\.gz$")


class StateRefused(Exception):
    """The sandbox cannot have its state; the message says why (its `last_log`)."""


class StateHold:
    def __init__(
        self,
        store: Store,
        artifacts: Artifacts,
        node: str,
        data_dir: Path,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._artifacts = artifacts
        self._node = node
        self._dir = data_dir / "states"
        self._data_dir = data_dir
        self._max = max_bytes
        self._clock = clock
        self.upload_tries = UPLOAD_TRIES
        self.conflicts = 0
        """Releases refused because the state had moved (this node had lost it)."""

    # -- start ----------------------------------------------------------------------------------

    async def claim(self, app: str, sandbox_id: str, path: str) -> tuple[int, StateLayer]:
        """The epoch this node holds the app's state at for `sandbox_id`, and the state to
        place at `path` in its tree. `StateRefused` when it is not held here for it, or its
        archive cannot be had or does not match its sha256 (then it is handed back)."""
        item = await self._store.get(keys.state(app), AppState)
        if item is None or item.value.node != self._node or item.value.sandbox != sandbox_id:
            where = "nobody" if item is None else state.holder(item.value)
            raise StateRefused(f"the state of app {app!r} is held by {where}, not for {sandbox_id}")
        record = item.value
        if record.archive is None:
            return record.epoch, StateLayer(path)
        try:
            data = await self._artifacts.fetch(record.archive)
            verify(data, record.archive)
        except (OSError, ArtifactError) as exc:
            reason = f"its state archive was refused, not restored: {exc}"
            await self._release(app, record.epoch, error=reason)
            raise StateRefused(reason) from exc
        return record.epoch, StateLayer(path, data, record.archive)

    # -- stop -----------------------------------------------------------------------------------

    async def hand_back(self, app: str, epoch: int, source: Path | None) -> None:
        """Archive `source` (the state directory; None: nothing newer than the state's own
        archive), store the archive and release the state held at `epoch`."""
        if source is None:
            await self._release(app, epoch)
            return
        try:
            data = await anyio.to_thread.run_sync(self._pack, source)
        except (ArtifactError, OSError) as exc:
            kept = await anyio.to_thread.run_sync(self._set_aside, source, app, epoch)
            await self._keep(app, epoch, f"its state was not archived: {exc}; {kept}")
            return
        local = await anyio.to_thread.run_sync(self._save, app, epoch, data)
        await self._store_and_release(app, epoch, local, data)

    def _pack(self, source: Path) -> bytes:
        return pack(source, skip=frozenset(), max_bytes=self._max)

    def _local(self, app: str, epoch: int) -> Path:
        return self._dir / f"{app}.{epoch}.tar.gz"

    def _save(self, app: str, epoch: int, data: bytes) -> Path:
        """Durably on this node: a temporary file, fsync'd, renamed into place, the directory
        fsync'd."""
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._local(app, epoch)
        partial = path.with_name(path.name + ".part")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        partial.replace(path)
        directory = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return path

    def _set_aside(self, source: Path, app: str, epoch: int) -> str:
        """A state directory that could not be archived, copied where it outlives its sandbox."""
        target = self._data_dir / "kept-states" / f"{app}.{epoch}"
        try:
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, symlinks=True)
        except OSError as exc:
            return f"it could not be kept on node {self._node} either ({exc})"
        return f"kept on node {self._node} in {target}"

    async def _store_and_release(self, app: str, epoch: int, local: Path, data: bytes) -> None:
        digest = digest_of(data)
        backoff = 0.5
        for attempt in range(self.upload_tries):
            try:
                await self._artifacts.store_state(data, digest)
                break
            except (ArtifactError, OSError) as exc:  # refused, or the blob store cannot write
                if attempt == self.upload_tries - 1:
                    await self._keep(
                        app,
                        epoch,
                        f"its archive could not be stored: {exc}; kept on node {self._node} "
                        f"in {local}, handed on when the blob store takes it",
                    )
                    return
                await anyio.sleep(backoff)
                backoff *= 2
        if await self._release(app, epoch, archive=digest, size=len(data)) is not None:
            await anyio.Path(local).unlink(missing_ok=True)

    async def _release(
        self, app: str, epoch: int, *, archive: str | None = None, size: int = 0, error: str = ""
    ) -> AppState | None:
        """Release by compare-and-set; the record written, or None when it had moved (or is
        gone). A local archive of a state this node no longer holds is of no use: deleted."""
        now = self._clock()
        written = await self._change(
            app,
            lambda record: state.release(
                record, self._node, epoch, now, archive=archive, size=size, error=error
            ),
        )
        if written is None:
            await anyio.Path(self._local(app, epoch)).unlink(missing_ok=True)
        else:
            log.info(
                "handed back the state of %s at epoch %d%s",
                app,
                epoch,
                "" if archive is None else f" with archive {archive[:12]} ({size} bytes)",
                extra={"node": self._node},
            )
        return written

    async def _keep(self, app: str, epoch: int, error: str) -> None:
        log.error("keeping the state of %s here: %s", app, error, extra={"node": self._node})
        await self._change(app, lambda record: state.keep(record, self._node, epoch, error))

    async def _change(
        self, app: str, decide: Callable[[AppState], AppState | state.Stale]
    ) -> AppState | None:
        key = keys.state(app)
        while True:
            item = await self._store.get(key, AppState)
            if item is None:
                return None  # the app was deleted
            decided = decide(item.value)
            if isinstance(decided, state.Stale):
                self.conflicts += 1
                log.warning("not writing the state: %s", decided.reason, extra={"node": self._node})
                return None
            try:
                await self._store.update(key, decided, expect_revision=item.revision)
            except Conflict:
                continue  # decide again from the fresh record
            return decided

    # -- what a previous run left, and what nobody uses -----------------------------------------

    async def salvage(self, sandboxes: list[Item[Sandbox]]) -> None:
        """Before a restarted agent clears its sandbox directories: pack the state directory
        of each state this node holds whose sandbox is not about to start (and that has no
        local archive yet), so `settle` hands it back with what the app last wrote."""
        records = {item.value.id: item.value for item in sandboxes}
        for item in (await self._store.list(keys.STATES, AppState)).items:
            held = item.value
            if held.node != self._node:
                continue
            sandbox = records.get(held.sandbox or "")
            if sandbox is not None and sandbox.status is SandboxStatus.PENDING:
                continue  # started (and restored) by this run
            if self._local(held.app, held.epoch).exists() or sandbox is None:
                continue
            pool = await self._store.get(keys.pool(sandbox.pool), Pool)
            spec = None if pool is None else pool.value.spec.state
            if spec is None:
                continue
            source = _left_tree(self._data_dir, sandbox.id, spec.path)
            if source is None:
                continue
            try:
                data = await anyio.to_thread.run_sync(self._pack, source)
            except (ArtifactError, OSError) as exc:
                kept = await anyio.to_thread.run_sync(self._set_aside, source, held.app, held.epoch)
                await self._keep(held.app, held.epoch, f"its state was not archived: {exc}; {kept}")
                continue
            await anyio.to_thread.run_sync(self._save, held.app, held.epoch, data)
            log.info("salvaged the state of %s left by the previous run", held.app)

    async def settle(self, in_use: Collection[str]) -> None:
        """Hand back every state this node holds that no sandbox of this run uses (`in_use`:
        the sandboxes it runs) and that no pending sandbox waits for: from its local archive
        when there is one, else unchanged (nothing newer than its archive exists here)."""
        for item in (await self._store.list(keys.STATES, AppState)).items:
            held = item.value
            if held.node != self._node or held.sandbox in in_use:
                continue
            if held.sandbox is not None:
                sandbox = await self._store.get(keys.sandbox(held.sandbox), Sandbox)
                if sandbox is not None and sandbox.value.status is SandboxStatus.PENDING:
                    continue  # placed here, about to start (or being started)
            local = self._local(held.app, held.epoch)
            if local.exists():
                data = await anyio.Path(local).read_bytes()
                await self._store_and_release(held.app, held.epoch, local, data)
            elif not held.kept:  # kept with a reason and no archive: an operator's to act on
                await self._release(held.app, held.epoch)
        await anyio.to_thread.run_sync(self._forget_stale)

    def _forget_stale(self) -> None:
        """Partial writes (a crash mid-save) are of no use."""
        with contextlib.suppress(OSError):
            for entry in self._dir.iterdir():
                if entry.name.endswith(".part"):
                    entry.unlink(missing_ok=True)

    async def run(self, in_use: Callable[[], Collection[str]], interval: float = 5.0) -> None:
        """`settle` every `interval` seconds; a store or blob store that is down only delays it."""
        while True:
            try:
                await self.settle(in_use())
            except (StoreError, OSError) as exc:
                log.warning("cannot settle held states now: %s", exc)
            await anyio.sleep(interval)


def _left_tree(data_dir: Path, sandbox_id: str, path: str) -> Path | None:
    """A previous run's state directory of `sandbox_id`: in its tmpfs (isolated as root) or in
    its working directory."""
    base = sandbox_dir(data_dir, sandbox_id)
    for tree in (base / "fs" / "app", base / "app"):
        if (tree / path).is_dir():
            return tree / path
    return None
