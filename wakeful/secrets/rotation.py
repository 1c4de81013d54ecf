"""A new secrets key, and every value sealed again under it, without a restart.

Theory of operation:
- `rotate_key` makes a key current (`KeyRing.rotate`), then `reseal` goes over `secrets/`:
  each record with a value under another key is written again, those values opened and sealed
  under the current key, by compare-and-set on the record and on `meta/secrets-key` as read.
  The values do not change, so neither generation moves and no sandbox restarts; a sandbox
  starting meanwhile gets the same values, from either sealing.
- Registries' logins (`registries/{host}`, `RegistryLogin`) are sealed under the same keys and
  go the same way in the same passes: each login whose password is under another key is
  written again, opened and sealed under the current key, by compare-and-set on the login and
  on `meta/secrets-key`. A rotation never leaves a login behind an app's secrets, so retiring
  a key (which counts both) waits for both.
- Certificates' keys from ACME (`acme/keys/{name}`, and the account's in `acme/account`) are
  sealed under the same keys and go the same way, each record by compare-and-set.
- A record changed meanwhile (a set, which seals under the current key itself) is read again
  on the next pass; passes go on until one finds nothing to seal again (at most `PASSES`).
- A control plane that stopped leading mid-rotation leaves values under the older key, which
  still opens them; the next leader finishes the work as it starts (`finish`), so a rotation
  under a failover still ends with every value under the new key.
- The older key is kept (old backups need it) until `wakeful secrets retire-key`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from wakeful.domain import keys
from wakeful.domain.models import (
    ACCOUNT_PURPOSE,
    AcmeAccount,
    AppSecrets,
    CertKey,
    RegistryLogin,
    cert_key_purpose,
)
from wakeful.store import Conflict, Item, Put, Require, Store, StoreError
from wakeful.store.errors import CorruptValue

from .errors import KeyRefused, SecretsError
from .keys import KeyRing

log = logging.getLogger(__name__)

PASSES = 10


@dataclass(frozen=True)
class Resealed:
    records: int
    """Apps' secrets records written."""
    values: int
    """Of their values, sealed again."""
    logins: int = 0
    """Registries' logins sealed again."""
    acme: int = 0
    """Keys from ACME (certificates' and the account's) sealed again."""


@dataclass(frozen=True)
class Rotated:
    key: str
    previous: str
    records: int
    values: int
    logins: int = 0
    acme: int = 0


async def rotate_key(store: Store, ring: KeyRing) -> Rotated:
    key_id, previous = await ring.rotate()
    done = await reseal(store, ring)
    return Rotated(key_id, previous, done.records, done.values, done.logins, done.acme)


async def reseal(store: Store, ring: KeyRing) -> Resealed:
    """Every value not under the current key sealed again under it: how many records and
    values were written. `KeyRefused` when records kept changing for `PASSES` passes."""
    records = values = logins = acme = 0
    for _ in range(PASSES):
        current = await ring.current()
        key_id = current.value.key
        listing = await store.list(keys.SECRETS, AppSecrets)
        behind = [
            item
            for item in listing.items
            if any(v.key_id != key_id for v in item.value.values.values())
        ]
        registries = await store.list(keys.REGISTRIES, RegistryLogin)
        logins_behind = [item for item in registries.items if item.value.key_id != key_id]
        acme_behind = await _acme_behind(store, key_id)
        if not behind and not logins_behind and not acme_behind:
            if values or logins or acme:
                log.info(
                    "sealed %d value(s) of %d app(s), %d registry login(s) and %d key(s) from "
                    "ACME again under %s",
                    values,
                    records,
                    logins,
                    acme,
                    key_id,
                )
            return Resealed(records, values, logins, acme)
        for item in behind:
            fresh, moved = _resealed(ring, item.value, key_id)
            require = [Require(item.key, item.revision), Require(current.key, current.revision)]
            try:
                await store.txn(require, [Put(item.key, fresh)])
            except Conflict:  # changed meanwhile: the next pass reads it again
                continue
            records += 1
            values += moved
        for login in logins_behind:
            plain = ring.open_login(login.value.host, login.value.password)
            sealed = ring.seal_login(key_id, login.value.host, plain)
            again = login.value.model_copy(update={"password": sealed})
            require = [Require(login.key, login.revision), Require(current.key, current.revision)]
            try:
                await store.txn(require, [Put(login.key, again)])
            except Conflict:  # changed or logged out meanwhile: the next pass reads it again
                continue
            logins += 1
        for held in acme_behind:
            sealed_again = _acme_resealed(ring, held.value, key_id)
            require = [Require(held.key, held.revision), Require(current.key, current.revision)]
            try:
                await store.txn(require, [Put(held.key, sealed_again)])
            except Conflict:  # renewed or dropped meanwhile: the next pass reads it again
                continue
            acme += 1
    raise KeyRefused(f"the secrets kept changing over {PASSES} passes; rotate again")


def _resealed(ring: KeyRing, record: AppSecrets, key_id: str) -> tuple[AppSecrets, int]:
    """`record` with every value under another key sealed again under `key_id`: the same
    values, set when and by whom they were; and how many were sealed again."""
    fresh = {}
    moved = 0
    for name, value in record.values.items():
        if value.key_id != key_id:
            plain = ring.open(record.app, name, value.sealed)
            value = value.model_copy(update={"sealed": ring.seal(key_id, record.app, name, plain)})
            moved += 1
        fresh[name] = value
    return record.model_copy(update={"values": fresh}), moved


async def _acme_behind(store: Store, key_id: str) -> list[Item[CertKey] | Item[AcmeAccount]]:
    """The certificates' keys and the account's sealed under another key."""
    found: list[Item[CertKey] | Item[AcmeAccount]] = []
    for item in (await store.list(keys.ACME_KEYS, CertKey)).items:
        if item.value.key_id != key_id:
            found.append(item)
    try:
        account = await store.get(keys.ACME_ACCOUNT, AcmeAccount)
    except CorruptValue:  # nothing to seal again: the certificate manager makes a new one
        account = None
    if account is not None and account.value.key_id != key_id:
        found.append(account)
    return found


def _acme_resealed(
    ring: KeyRing, record: CertKey | AcmeAccount, key_id: str
) -> CertKey | AcmeAccount:
    purpose = ACCOUNT_PURPOSE if isinstance(record, AcmeAccount) else cert_key_purpose(record.name)
    plain = ring.open_for(purpose, record.key)
    return record.model_copy(update={"key": ring.seal_for(key_id, purpose, plain)})


async def finish(store: Store, ring: KeyRing) -> None:
    """What a rotation left under an older key, sealed again (a control plane starting); a
    failure is logged, never raised: the values still open."""
    try:
        done = await reseal(store, ring)
    except (StoreError, SecretsError) as exc:
        log.warning("could not seal the secrets again under the current key: %s", exc)
        return
    if done.values or done.logins or done.acme:
        log.info(
            "finished a rotation: %d value(s), %d registry login(s) and %d key(s) from ACME "
            "sealed again",
            done.values,
            done.logins,
            done.acme,
        )
