"""The control plane's secrets keys: one file per key in a private directory, and the id of
the current key in the store.

Theory of operation:
- **The directory** (`WAKEFUL_SECRETS_KEYS`, by default `<data dir>/secret-keys`; its files,
  `keydir.py`): private, one `<id>.key` of 32 random bytes per key, never overwritten.
  Activators that stand in for each other share it, as they share the artifact directory.
- **The current key** is the one `meta/secrets-key` names: only the store says which key new
  values are sealed under, so activators sharing the directory agree. A change of secrets
  requires that record's revision in its transaction (`book.py`), so nothing is ever sealed
  under a key a rotation just replaced.
- **`start`** (a control plane starting): the first key is made when the store names none;
  of two activators starting at once, one record wins and the loser removes its key file.
  Then `check`.
- **`check`** (also an activator before it stands by): the current key and the key of every
  sealed value in the store (apps' secrets and registries' passwords, `registries/`) must be
  in the directory, and one value under each key must open with it. Otherwise `MissingKey`
  or `KeysUnusable`: one line naming the key id and the directory, and the control plane
  does not start: serving apps without their secrets would be worse than not serving.
- Keys are read once and kept in memory; an id not in memory is looked for again in the
  directory (another activator may have just made it).
- **`rotate`** makes a key and makes it current by compare-and-set (`rotation.py` then seals
  every value again under it); **`retire`** deletes a key's file, never the current key's, one
  made after the current key became current (a rotation may be about to make it current), one
  a value in the store (a secret or a registry's password) is still sealed under, nor one a
  starting sandbox's placement names. Keys are otherwise kept, for old backups. In one
  process the two take turns (one lock), so a retire never deletes the key a rotation has
  made and not yet made current.
- A write that fails with `AlreadyExists` or `Conflict` may be etcd's retry of a write that
  had committed: before a key made for it is discarded, `meta/secrets-key` is read again, and
  the key is kept when the record names it.
- **`place`** MACs a sandbox's placement (`Sandbox.placement`) under the current key's
  placement key (`sealing.placement_key`), the id this ring last read from the store;
  **`placed`** verifies one with the key its id names. A placement under an older key keeps
  verifying while that key is here.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakeful.domain import keys
from wakeful.domain.models import (
    ACCOUNT_PURPOSE,
    KEY_ID_PATTERN,
    NONCE_BYTES,
    STARTING,
    AcmeAccount,
    AppSecrets,
    CertKey,
    Leader,
    RegistryLogin,
    Sandbox,
    SecretsKey,
    cert_key_purpose,
)
from wakeful.store import AlreadyExists, Conflict, Item, Store
from wakeful.store.errors import CorruptValue

from . import sealing
from .errors import KeyRefused, KeysUnusable, MissingKey, NoSuchKey, SealError, UnknownKey
from .keydir import KeyDirectory
from .rules import KeyReport, replaces_missing_key

log = logging.getLogger(__name__)

FILE_TIME_SLACK = 0.01
"""How much earlier than the wall clock a file written at that moment may be stamped (the
kernel's coarse clock, up to a tick, 1 to 10 ms, behind `time.time()`): a key file stamped
within this of the current key's `since` counts as made after it (`_since`)."""


@dataclass(frozen=True)
class _Held:
    """One key in memory: its cipher, and the key placements under it are made with."""

    aead: AESGCM
    placing: bytes

    @classmethod
    def of(cls, key: bytes) -> _Held:
        return cls(sealing.cipher(key), sealing.placement_key(key))


class KeyRing:
    def __init__(
        self, store: Store, directory: Path, *, clock: Callable[[], float] = time.time
    ) -> None:
        """`clock`: wall time (a key's file time is compared with `SecretsKey.since`)."""
        self._store = store
        self._files = KeyDirectory(directory)
        self._dir = directory
        self._clock = clock
        self._held: dict[str, _Held] = {}
        self._current: str | None = None
        """The current key's id as this ring last read or wrote it (`place` uses it)."""
        self._turns = anyio.Lock()
        """Rotate and retire, one at a time."""

    @property
    def directory(self) -> Path:
        return self._dir

    # -- sealing with the keys held ---------------------------------------------------------

    def seal(self, key_id: str, app: str, name: str, value: str) -> str:
        aead = self.aead(key_id)
        if aead is None:
            raise MissingKey(key_id, self._dir, "it is the current key")
        return sealing.seal(aead, key_id, app, name, value, os.urandom(NONCE_BYTES))

    def open(self, app: str, name: str, sealed: str) -> str:
        """`SealError` (`UnknownKey` for a key not in the directory) when it does not open."""
        return sealing.open_sealed(self.aead, app, name, sealed)

    def seal_login(self, key_id: str, host: str, password: str) -> str:
        """A registry's password sealed under `key_id`, bound to `host`."""
        return self._seal_bound(key_id, sealing.registry_data(host), password)

    def open_login(self, host: str, sealed: str) -> str:
        """A registry's password; `SealError` (`UnknownKey`) when it does not open."""
        what = f"the login for registry {host}"
        return sealing.open_bound(self.aead, sealing.registry_data(host), sealed, what, "host")

    def seal_for(self, key_id: str, purpose: str, value: str) -> str:
        """`value` sealed under `key_id`, bound to `purpose` (`acme account`, `acme
        certificate shop.example.com`): a record moved to another purpose does not open."""
        return self._seal_bound(key_id, sealing.purpose_data(purpose), value)

    def _seal_bound(self, key_id: str, data: bytes, value: str) -> str:
        aead = self.aead(key_id)
        if aead is None:
            raise MissingKey(key_id, self._dir, "it is the current key")
        return sealing.seal_bound(aead, key_id, data, value, os.urandom(NONCE_BYTES))

    def open_for(self, purpose: str, sealed: str) -> str:
        """What `seal_for` sealed for `purpose`; `SealError` (`UnknownKey`) when it does not
        open."""
        data = sealing.purpose_data(purpose)
        return sealing.open_bound(self.aead, data, sealed, f"the {purpose}'s key", "purpose")

    def aead(self, key_id: str) -> AESGCM | None:
        """The key `key_id`, from memory or its file; None when there is no such file."""
        held = self._hold(key_id)
        return None if held is None else held.aead

    # -- placements -------------------------------------------------------------------------

    def place(
        self, sandbox_id: str, app: str, pool: str, node: str, secrets_generation: int, /
    ) -> str:
        """The placement of a sandbox the pool controller creates, under the current key
        (`wakeful.controller.reconciler.Placer`)."""
        key_id = self._current
        held = None if key_id is None else self._hold(key_id)
        if key_id is None or held is None:
            raise KeysUnusable(f"no current secrets key in {self._dir} to place sandboxes with")
        message = sealing.placement_message(sandbox_id, app, pool, node, secrets_generation)
        return sealing.place(held.placing, key_id, message)

    def placed(self, sandbox: Sandbox) -> bool:
        """Whether the control plane placed `sandbox` as its record says: its placement
        verifies over its id, app, pool, node and secrets generation, under a key here."""
        if sandbox.node is None:
            return False
        message = sealing.placement_message(
            sandbox.id, sandbox.app, sandbox.pool, sandbox.node, sandbox.secrets_generation
        )
        return sealing.verify_placement(self._placing, sandbox.placement, message)

    def _placing(self, key_id: str) -> bytes | None:
        held = self._hold(key_id)
        return None if held is None else held.placing

    def _hold(self, key_id: str) -> _Held | None:
        """The key `key_id`, from memory or its file; None when there is no such file."""
        held = self._held.get(key_id)
        if held is not None or not re.fullmatch(KEY_ID_PATTERN, key_id):
            return held
        data = self._files.read(key_id)
        if data is None:
            return None
        try:
            held = self._held[key_id] = _Held.of(data)
        except ValueError as exc:
            raise KeysUnusable(f"{self._files.where(key_id)}: not a secrets key: {exc}") from None
        return held

    def ids(self) -> list[str]:
        """The ids of the key files in the directory."""
        return self._files.ids()

    # -- what the store says ----------------------------------------------------------------

    async def current(self) -> Item[SecretsKey]:
        found = await self._store.get(keys.SECRETS_KEY, SecretsKey)
        if found is None:
            raise KeysUnusable(f"the store names no current secrets key ({keys.SECRETS_KEY})")
        self._current = found.value.key
        return found

    async def start(self, *, leading: bool = True) -> str:
        """The current key's id, made at the first start; then `check`. `leading`: this
        control plane holds the activator's term (`replaces_missing_key`)."""
        self._files.private()
        while (found := await self._store.get(keys.SECRETS_KEY, SecretsKey)) is None:
            key_id = self._make()
            try:
                await self._store.create(
                    keys.SECRETS_KEY, SecretsKey(key=key_id, since=await self._since())
                )
            except AlreadyExists:  # another activator made the first key at the same moment
                await self._discard(key_id)  # (or etcd retried our write: then it is kept)
                continue
            log.info("made the first secrets key, %s, in %s", key_id, self._dir)
        if self.aead(found.value.key) is None:
            led = not leading and await self._store.get(keys.leader("activator"), Leader)
            if replaces_missing_key(bool(await self.usage()), leading, led is not None):
                found = await self._replace_unused(found)
        self._current = found.value.key
        await self.check()
        return found.value.key

    async def _replace_unused(self, found: Item[SecretsKey]) -> Item[SecretsKey]:
        """A key made here current in place of the store's, which is not here, when
        `replaces_missing_key` says nothing is lost by it."""
        key_id = self._make()
        written = SecretsKey(key=key_id, since=await self._since())
        try:
            revision = await self._store.update(keys.SECRETS_KEY, written, found.revision)
        except Conflict:  # another activator did the same, or a rotation: read it again
            await self._discard(key_id)
            return await self.current()
        log.warning(
            "the current secrets key %s is not in %s and no value is sealed under any key: "
            "made %s current in its place",
            found.value.key,
            self._dir,
            key_id,
        )
        return Item(keys.SECRETS_KEY, written, revision)

    async def check(self) -> int:
        """How many key ids the store uses, each proved by opening one value sealed under it;
        `MissingKey` or `KeysUnusable` (one line naming the key id and the directory) when
        one is not here or does not open what it sealed."""
        self._files.private()
        found = await self._store.get(keys.SECRETS_KEY, SecretsKey)
        if found is not None and self.aead(found.value.key) is None:
            raise MissingKey(found.value.key, self._dir, "the store names it as the current key")
        listing = await self._store.list(keys.SECRETS, AppSecrets)
        if listing.invalid:
            raise KeysUnusable(
                f"{listing.invalid[0]} is not a record of an app's secrets this wakeful can "
                "read: its values cannot be given to the app"
            )
        logins = await self._store.list(keys.REGISTRIES, RegistryLogin)
        if logins.invalid:
            raise KeysUnusable(
                f"{logins.invalid[0]} is not a registry login this wakeful can read: images "
                "from that registry could not be pulled"
            )
        tried: set[str] = set()

        def attempt(key_id: str, why: str, opening: Callable[[], str]) -> None:
            if key_id in tried:
                return
            tried.add(key_id)
            try:
                opening()
            except UnknownKey as exc:
                raise MissingKey(exc.key_id, self._dir, why) from None
            except SealError as exc:
                raise KeysUnusable(f"{exc} (keys in {self._dir})") from None

        for item in listing.items:
            app = item.value.app
            for name, value in item.value.values.items():
                opening = functools.partial(self.open, app, name, value.sealed)
                attempt(value.key_id, f"{app}'s secret {name} is sealed under it", opening)
        for login in logins.items:
            host, sealed = login.value.host, login.value.password
            opening = functools.partial(self.open_login, host, sealed)
            why = f"the login for registry {host} is sealed under it"
            attempt(login.value.key_id, why, opening)
        for purpose, sealed in await self._acme_keys():
            opening = functools.partial(self.open_for, purpose, sealed)
            attempt(sealing.key_id_of(sealed), f"the {purpose}'s key is sealed under it", opening)
        return len(tried)

    async def _acme_keys(self) -> list[tuple[str, str]]:
        """(purpose, sealed key) of every key from ACME: each certificate's, the account's."""
        found = [
            (cert_key_purpose(item.value.name), item.value.key)
            for item in (await self._store.list(keys.ACME_KEYS, CertKey)).items
        ]
        try:
            account = await self._store.get(keys.ACME_ACCOUNT, AcmeAccount)
        except CorruptValue as exc:  # never a reason not to start: a new account replaces it
            log.warning("%s; the certificate manager makes a new account", exc)
            account = None
        if account is not None:
            found.append((ACCOUNT_PURPOSE, account.value.key))
        return found

    async def usage(self) -> dict[str, Counter[str]]:
        """Per key id, how many values of each app are sealed under it; a registry's login
        counts under `registry HOST`, a key from ACME under its purpose (`acme account`,
        `acme certificate NAME`)."""
        used: dict[str, Counter[str]] = {}
        for item in (await self._store.list(keys.SECRETS, AppSecrets)).items:
            for value in item.value.values.values():
                used.setdefault(value.key_id, Counter())[item.value.app] += 1
        for login in (await self._store.list(keys.REGISTRIES, RegistryLogin)).items:
            used.setdefault(login.value.key_id, Counter())[f"registry {login.value.host}"] += 1
        for purpose, sealed in await self._acme_keys():
            used.setdefault(sealing.key_id_of(sealed), Counter())[purpose] += 1
        return used

    async def report(self) -> list[KeyReport]:
        current = (await self.current()).value.key
        used: defaultdict[str, Counter[str]] = defaultdict(Counter, await self.usage())
        present = set(self.ids())
        return [
            KeyReport(key_id, key_id == current, key_id in present, used[key_id].total())
            for key_id in sorted(present | used.keys() | {current})
        ]

    # -- rotation and retirement ------------------------------------------------------------

    async def rotate(self) -> tuple[str, str]:
        """A new key, made current: (its id, the previous key's id). The values sealed under
        older keys stay so until sealed again (`rotation.reseal`)."""
        async with self._turns:
            previous = await self.current()
            self._files.private()
            key_id = self._make()
            written = SecretsKey(key=key_id, since=await self._since())
            try:
                await self._store.update(keys.SECRETS_KEY, written, previous.revision)
            except Conflict:
                if await self._discard(key_id):  # else etcd retried our committed write
                    raise KeyRefused("another rotation made a new key at the same moment") from None
            self._current = key_id
        log.info("secrets key %s is current, after %s", key_id, previous.value.key)
        return key_id, previous.value.key

    async def retire(self, key_id: str) -> None:
        """Delete the key's file: refused (`KeyRefused`) for the current key, for one made
        after the current key became current, for a key a value in the store is sealed under,
        and for one a starting sandbox's placement names."""
        async with self._turns:
            await self._retire(key_id)
        log.info("retired secrets key %s", key_id)

    async def _retire(self, key_id: str) -> None:
        current = (await self.current()).value
        if current.key == key_id:
            raise KeyRefused(
                f"key {key_id} is the current key: `wakeful secrets rotate-key` makes another "
                "current first"
            )
        path = self._files.where(key_id)
        try:
            made = path.stat().st_mtime
        except FileNotFoundError:
            raise NoSuchKey(f"no secrets key {key_id} in {self._dir}") from None
        if made >= current.since - FILE_TIME_SLACK:
            raise KeyRefused(
                f"key {key_id} was made after the current key {current.key} became current: "
                "it is not an older key (a rotation may be about to make it current)"
            )
        used = (await self.usage()).get(key_id)
        if used:
            apps = ", ".join(sorted(used))
            raise KeyRefused(
                f"{sum(used.values())} value(s) of {apps} are still sealed under key {key_id}: "
                "`wakeful secrets rotate-key` seals them again under a new key"
            )
        starting = await self.placements(key_id)
        if starting:
            raise KeyRefused(
                f"{starting} starting sandbox(es) were placed under key {key_id}: retire it "
                "once they have started"
            )
        try:
            path.unlink()
        except FileNotFoundError:
            raise NoSuchKey(f"no secrets key {key_id} in {self._dir}") from None
        self._held.pop(key_id, None)

    async def placements(self, key_id: str) -> int:
        """How many starting sandboxes' placements name the key `key_id`: each would be
        refused its secrets without it. (Only a starting sandbox's placement is ever checked:
        `SecretBook.env_for` answers for no other.)"""
        sandboxes = (await self._store.list(keys.SANDBOXES, Sandbox)).items
        return sum(
            1
            for s in sandboxes
            if s.value.status in STARTING and sealing.placement_key_id(s.value.placement) == key_id
        )

    # -- the directory ----------------------------------------------------------------------

    async def _since(self) -> float:
        """The `since` of a key becoming current now: the clock, once `FILE_TIME_SLACK` has
        passed since the newest key file here (a tick at most): older files read as older."""
        times = (self._files.where(key_id).stat().st_mtime for key_id in self._files.ids())
        after = max(times, default=0.0) + FILE_TIME_SLACK
        if (wait := after - self._clock()) >= 0:
            await anyio.sleep(wait + 0.001)
        return max(self._clock(), after + 0.001)

    def _make(self) -> str:
        """A new key's file, held; its id."""
        key_id, key = self._files.make()
        self._held[key_id] = _Held.of(key)
        return key_id

    async def _discard(self, key_id: str) -> bool:
        """A key made for a write that failed, removed unless the store names it after all
        (etcd retried a write that had committed, and the retry found it done): whether it
        was removed. Nothing was sealed under a key the store never named."""
        found = await self._store.get(keys.SECRETS_KEY, SecretsKey)
        if found is not None and found.value.key == key_id:
            return False
        self._held.pop(key_id, None)
        self._files.remove(key_id)
        return True
