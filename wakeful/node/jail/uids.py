"""How a sandbox gets its uid: each app its own, from a range no other user of the machine has,
allocated once per data directory and claimed machine-wide (as root; not root, every sandbox
keeps the agent's uid)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from . import IsolationUnavailable

UID_BASE = 400_000
"""Per-app uids are UID_BASE + n: above the usual subordinate-uid ranges (100000-165535)."""
UID_COUNT = 100_000


UID_CLAIMS = Path("/run/wakeful/uids")
"""One file per sandbox uid in use on this machine, named by the uid, holding the data
directory whose agent holds it: agents with different data directories on one machine never
hand one uid to two apps. Under /run, so a reboot clears it with everything the uids owned."""


class UidTable:
    """Each app's own uid on this node, allocated once and recorded in `uids.json`.

    `uid` allocates in memory; `save` writes the table when it changed, which a start does
    after its exec (`ProcessRuntime`), not before: a new app's first start paid ~0.4 ms of
    file writing on its critical path. Writing later loses nothing that matters: the table is
    replaced whole by a rename and never fsynced anyway, and an entry lost in a crash or a power
    cut only gives its uid to the next app, while nothing owned by a uid outlives the agent
    (sandbox trees are tmpfs, cleared at start).

    A uid is also claimed machine-wide in `claims` (`UID_CLAIMS`), under a lock every agent
    takes (`_machine_lock`), before it is given to an app: a uid another data directory's
    agent claimed is skipped, and a recorded uid such an agent claimed since is given up
    (re-allocated). A claim whose data directory no longer exists is stale: swept when a
    table is made (an agent starts), taken over when no unclaimed uid is left."""

    def __init__(
        self,
        path: Path,
        claims: Path = UID_CLAIMS,
        uids: tuple[int, int] = (UID_BASE, UID_BASE + UID_COUNT - 1),
    ) -> None:
        self._path = path
        self._claims = claims
        self._range = range(uids[0], uids[1] + 1)
        self._owner = str(path.parent.resolve())
        self._lock = threading.Lock()  # sandboxes start in worker threads, several at once
        self._uids: dict[str, int] = {}
        self._unsaved = False
        with contextlib.suppress(FileNotFoundError):
            loaded = json.loads(path.read_text())
            # A uid outside this agent's range (WAKEFUL_SANDBOX_UIDS changed) is allocated anew.
            self._uids = {str(k): int(v) for k, v in loaded.items() if int(v) in self._range}
        claims.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._machine_lock():
            self._sweep()
            for app, uid in list(self._uids.items()):
                if not self._claim(uid):
                    del self._uids[app]
                    self._unsaved = True

    def uid(self, app: str) -> int:
        with self._lock:
            found = self._uids.get(app)
            if found is not None:
                return found
            taken = set(self._uids.values())
            with self._machine_lock():
                # A uid nobody claimed is the usual find: one directory listing, one claim
                # written (reading every claim cost a new app's start ~1.5 ms with 60 of them);
                # stale claims are taken over only when none is left.
                claimed = {int(n) for n in os.listdir(self._claims) if n.isdigit()} | taken
                uid = next((n for n in self._range if n not in claimed), None)
                if uid is not None:
                    self._write_claim(uid)
                else:
                    uid = next((n for n in self._range if n not in taken and self._claim(n)), None)
            if uid is None:
                raise IsolationUnavailable(f"no free sandbox uid left for app {app!r}")
            self._uids[app] = uid
            self._unsaved = True
            return uid

    @contextlib.contextmanager
    def _machine_lock(self) -> Iterator[None]:
        """Every agent's claims are made under one lock (`flock` on `claims/.lock`): a claim
        read, judged stale and replaced is one step no other agent can interleave with."""
        fd = os.open(self._claims / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _claim(self, uid: int) -> bool:
        """Hold `uid` for this data directory machine-wide (under `_machine_lock`): True when
        it is (or now is) ours; False when another data directory that still exists holds it."""
        claim = self._claims / str(uid)
        try:
            owner = claim.read_text()
        except FileNotFoundError:
            owner = ""
        if owner == self._owner:
            return True
        if owner and Path(owner).is_dir():
            return False
        self._write_claim(uid)
        return True

    def _sweep(self) -> None:
        """Remove the claims whose data directory is gone (at start, under the lock): a new
        app's allocation then reads no claim, only the directory's names."""
        for name in os.listdir(self._claims):
            if not name.isdigit():
                continue
            claim = self._claims / name
            with contextlib.suppress(FileNotFoundError):
                owner = claim.read_text()
                if not owner or not Path(owner).is_dir():
                    claim.unlink()

    def _write_claim(self, uid: int) -> None:
        claim = self._claims / str(uid)
        tmp = claim.with_name(f".{uid}.tmp")
        tmp.write_text(self._owner)
        tmp.replace(claim)  # never seen empty or half written

    def save(self) -> None:
        """Write the table if an allocation changed it since the last save."""
        with self._lock:
            if not self._unsaved:
                return
            tmp = self._path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(self._uids, out)
            tmp.replace(self._path)
            self._unsaved = False
