"""An app's secrets: set, unset and listed by the admin, handed to a node for a sandbox it is
starting, and nowhere else.

Theory of operation:
- **A change** (`change`, and `set`/`unset` over it) reads the app, its secrets record, the
  current key and the manifests that may conflict, checks the change (`rules.check_change`),
  seals what is new, and writes `secrets/{app}` in one transaction that requires all three
  records at the revisions read: an app deleted meanwhile, a concurrent change, or a rotation
  makes it read and decide again (so nothing is sealed under a key a rotation just replaced,
  and no record outlives its app). A value set to what it already is stays as it is; values
  still sealed under an older key are sealed again under the current one on the way.
- Every change raises `generation`; unless `restart` is false it raises `restart_generation`
  too, and the pool controller replaces, replace-then-drain, every sandbox of the app created
  at a lower one (`Sandbox.secrets_generation`). Values do not change in a rotation, so it
  raises neither.
- **A node** gets an app's values (`env_for`) only for a sandbox whose record places it on that
  node and that is starting (pending or booting): at its start, never later, never another
  node's. A node may write `sandboxes/`, so the record alone proves nothing: its placement
  (`Sandbox.placement`, the pool controller's MAC over id, app, pool, node and secrets
  generation, `KeyRing.placed`) must verify, and the sandbox must not be behind the app's
  `restart_generation` (it is being replaced: it gets nothing new). A node elsewhere asks
  through the control API with its node token (`api.py`, `GET /v1/sandboxes/{id}/secrets`);
  the node agent of `wakeful up` through `for_node`.
- **A listing** holds names, when and by which token each was set: never a value. No log
  line here holds a value either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from wakeful.domain import keys
from wakeful.domain.models import (
    SIZED,
    STARTING,
    App,
    AppSecrets,
    Pool,
    RolloutRecord,
    Sandbox,
    SealedValue,
    Version,
    plain_size,
)
from wakeful.store import Conflict, Put, Require, Store

from .errors import ChangeRefused, NotYours, SealError, UnknownSandbox
from .keys import KeyRing
from .rotation import Rotated, rotate_key
from .rotation import finish as finish_rotation
from .rules import Change, check_change

log = logging.getLogger(__name__)

ATTEMPTS = 20
"""Reads and decisions again after a conflict, before the change is refused (409)."""


@dataclass(frozen=True)
class SecretEnv:
    """What a sandbox's environment gets of its app's secrets, at `generation` (0 and empty
    when the app has none)."""

    generation: int
    env: dict[str, str]

    def __repr__(self) -> str:  # a traceback or a debug line never shows the values
        return f"SecretEnv(generation={self.generation}, names={sorted(self.env)})"


@dataclass(frozen=True)
class Changed:
    app: str
    set: list[str]
    """Names whose value is new."""
    unchanged: list[str]
    """Names set to the value they had: left as they were."""
    unset: list[str]
    generation: int
    restart_generation: int
    restart: bool
    """Whether this change restarts the app's sandboxes (False too when nothing changed)."""
    sandboxes: int
    """The app's sandboxes behind the new restart generation, which are being replaced."""

    @property
    def written(self) -> bool:
        return bool(self.set or self.unset)


@dataclass(frozen=True)
class Entry:
    name: str
    set_at: float
    set_by: str
    key_id: str
    """The key its value is sealed under (never the value)."""


@dataclass(frozen=True)
class Listed:
    app: str
    generation: int
    restart_generation: int
    secrets: list[Entry]


class NodeSecrets:
    """What a node agent in this process asks for (`wakeful up`): a sandbox's secrets, for
    the one node it was made for."""

    def __init__(self, book: SecretBook, node: str) -> None:
        self._book = book
        self._node = node

    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        return (await self._book.env_for(self._node, sandbox_id)).env


class SecretBook:
    def __init__(
        self, store: Store, ring: KeyRing, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._ring = ring
        self._clock = clock

    @classmethod
    async def opened(cls, store: Store, directory: Path) -> SecretBook:
        """The book of a control plane starting: its keys checked against the store
        (`KeysUnusable`: it does not serve apps without their secrets), and what a rotation
        cut short left under an older key sealed again."""
        ring = KeyRing(store, directory)
        await ring.start()
        await finish_rotation(store, ring)
        return cls(store, ring)

    @property
    def ring(self) -> KeyRing:
        return self._ring

    async def rotate_key(self) -> Rotated:
        """A new key, current at once, and every value sealed again under it."""
        return await rotate_key(self._store, self._ring)

    def for_node(self, node: str) -> NodeSecrets:
        return NodeSecrets(self, node)

    async def set(
        self, app: str, values: Mapping[str, str], *, by: str, restart: bool = True
    ) -> Changed:
        return await self.change(app, Change(dict(values), [], restart), by=by)

    async def unset(
        self, app: str, names: Sequence[str], *, by: str, restart: bool = True
    ) -> Changed:
        return await self.change(app, Change({}, list(dict.fromkeys(names)), restart), by=by)

    async def change(self, app: str, change: Change, *, by: str) -> Changed:
        """Made, or refused with nothing written (`ChangeRefused`)."""
        for _ in range(ATTEMPTS):
            found = await self._store.get(keys.app(app), App)
            if found is None:
                raise ChangeRefused("unknown", f"no app named {app!r}")
            key = await self._ring.current()
            record = await self._store.get(keys.secrets(app), AppSecrets)
            old = record.value if record is not None else AppSecrets(app=app)
            present = {name: plain_size(v.sealed) for name, v in old.values.items()}
            check_change(change, app, present, await self._manifests(found.value))
            values, new, unchanged = self._sealed(old, change, key.value.key, by)
            if not new and not change.unset:  # every value as it was: nothing to write
                return Changed(
                    app, [], unchanged, [], old.generation, old.restart_generation, False, 0
                )
            written = AppSecrets(
                app=app,
                values=values,
                generation=old.generation + 1,
                restart_generation=old.restart_generation + (1 if change.restart else 0),
            )
            require = [
                Require(found.key, found.revision),
                Require(keys.secrets(app), record.revision if record is not None else 0),
                Require(key.key, key.revision),
            ]
            try:
                await self._store.txn(require, [Put(keys.secrets(app), written)])
            except Conflict:
                continue
            log.info(
                "secrets of %s changed: set %s, unset %s (generation %d%s)",
                app,
                ",".join(new) or "-",
                ",".join(change.unset) or "-",
                written.generation,
                "" if change.restart else ", no restart",
                extra={"app": app},
            )
            behind = await self._behind(app, written.restart_generation) if change.restart else 0
            return Changed(
                app,
                new,
                unchanged,
                list(change.unset),
                written.generation,
                written.restart_generation,
                change.restart,
                behind,
            )
        raise ChangeRefused("conflict", f"the secrets of {app} kept changing; try again")

    def _sealed(
        self, old: AppSecrets, change: Change, key_id: str, by: str
    ) -> tuple[dict[str, SealedValue], list[str], list[str]]:
        """The record's values after `change`: (values, names newly set, names set to what
        they were). Kept values under an older key are sealed again under `key_id`."""
        now = self._clock()
        values: dict[str, SealedValue] = {}
        for name, value in old.values.items():
            if name in change.unset or name in change.set:
                continue
            if value.key_id != key_id:
                plain = self._ring.open(old.app, name, value.sealed)
                value = value.model_copy(
                    update={"sealed": self._ring.seal(key_id, old.app, name, plain)}
                )
            values[name] = value
        new, unchanged = [], []
        for name, plain in sorted(change.set.items()):
            before = old.values.get(name)
            if (
                before is not None
                and before.key_id == key_id
                and self._holds(old.app, name, before, plain)
            ):
                values[name] = before
                unchanged.append(name)
                continue
            sealed = self._ring.seal(key_id, old.app, name, plain)
            values[name] = SealedValue(sealed=sealed, set_at=now, set_by=by)
            new.append(name)
        return values, new, unchanged

    def _holds(self, app: str, name: str, value: SealedValue, plain: str) -> bool:
        try:
            return self._ring.open(app, name, value.sealed) == plain
        except SealError:
            return False

    async def _manifests(self, app: App) -> dict[str, list[str]]:
        """The `env` names of the app's active version and of any version rolling out."""
        versions = {app.active_version} if app.active_version else set()
        for item in (await self._store.list(keys.rollouts_of(app.name), RolloutRecord)).items:
            if item.value.phase == "rolling":
                versions.add(item.value.version)
        found = {}
        for version in sorted(versions):
            record = await self._store.get(keys.version(app.name, version), Version)
            if record is not None:
                found[version] = list(record.value.spec.env)
        return found

    async def _behind(self, app: str, restart_generation: int) -> int:
        """The app's live sandboxes the pool controller replaces: those of retired pools go
        away by themselves and are not counted."""
        retired = {
            item.value.name
            for item in (await self._store.list(keys.POOLS, Pool)).items
            if item.value.app == app and item.value.retired
        }
        sandboxes = (await self._store.list(keys.SANDBOXES, Sandbox)).items
        return sum(
            1
            for s in sandboxes
            if s.value.app == app
            and s.value.pool not in retired
            and s.value.status in SIZED
            and s.value.secrets_generation < restart_generation
        )

    async def listing(self, app: str) -> Listed:
        """Names, when and by whom each was set, under which key: never a value.
        `ChangeRefused("unknown")` for no such app."""
        if await self._store.get(keys.app(app), App) is None:
            raise ChangeRefused("unknown", f"no app named {app!r}")
        record = await self._store.get(keys.secrets(app), AppSecrets)
        if record is None:
            return Listed(app, 0, 0, [])
        entries = [
            Entry(name, value.set_at, value.set_by, value.key_id)
            for name, value in sorted(record.value.values.items())
        ]
        return Listed(app, record.value.generation, record.value.restart_generation, entries)

    async def env_for(self, node: str, sandbox_id: str) -> SecretEnv:
        """The values of the app of `sandbox_id`, for `node` to start it with: `NotYours`
        unless its record places it on `node`, it is starting, the control plane placed it so
        (its placement verifies) and it is not behind the app's restart generation;
        `UnknownSandbox`. One rule for every app: one without secrets answers an empty env
        only past the same checks."""
        found = await self._store.get(keys.sandbox(sandbox_id), Sandbox)
        if found is None:
            raise UnknownSandbox(f"no sandbox {sandbox_id}")
        sandbox = found.value
        if sandbox.node != node or sandbox.status not in STARTING:
            raise NotYours(f"sandbox {sandbox_id} is not one node {node} is starting")
        if not self._ring.placed(sandbox):
            raise NotYours(
                f"sandbox {sandbox_id} was not placed on node {node} for {sandbox.app} by the "
                "control plane: its record's placement does not verify"
            )
        record = await self._store.get(keys.secrets(sandbox.app), AppSecrets)
        if record is None:
            return SecretEnv(0, {})
        if sandbox.secrets_generation < record.value.restart_generation:
            raise NotYours(
                f"sandbox {sandbox_id} was created at secrets generation "
                f"{sandbox.secrets_generation}, behind {sandbox.app}'s "
                f"{record.value.restart_generation}: it is being replaced"
            )
        env = {
            name: self._ring.open(sandbox.app, name, value.sealed)
            for name, value in record.value.values.items()
        }
        return SecretEnv(record.value.generation, env)

    async def without_values(self, sandbox_id: str) -> SecretEnv:
        """For a node that runs with the admin token (a setup the CLI warns about): nothing
        for a sandbox whose app has no secrets, so such apps still start; `NotYours` for one
        whose app has some (they go to a node token named after the sandbox's node only: no
        value is read back with the admin token); `UnknownSandbox`."""
        found = await self._store.get(keys.sandbox(sandbox_id), Sandbox)
        if found is None:
            raise UnknownSandbox(f"no sandbox {sandbox_id}")
        record = await self._store.get(keys.secrets(found.value.app), AppSecrets)
        if record is not None and record.value.values:
            raise NotYours(
                f"the app of sandbox {sandbox_id} has secrets, which only a node token named "
                f"after its node ({found.value.node}) fetches: this node runs with the admin "
                "token; give it one (`wakeful tokens create --role node --name NODE`)"
            )
        return SecretEnv(record.value.generation if record is not None else 0, {})
