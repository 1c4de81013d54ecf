"""A new secrets key, and every value sealed again under it, without a restart.

Theory of operation:
- `rotate_key` makes a key current (`KeyRing.rotate`), then `reseal` goes over `secrets/`:
  each record with a value under another key is written again, those values opened and sealed
  under the current key, by compare-and-set on the record and on `meta/secrets-key` as read.
  The values do not change, so neither generation moves and no sandbox restarts; a sandbox
  starting meanwhile gets the same values, from either sealing.
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
from wakeful.domain.models import AppSecrets
from wakeful.store import Conflict, Put, Require, Store, StoreError

from .errors import KeyRefused, SecretsError
from .keys import KeyRing

log = logging.getLogger(__name__)

PASSES = 10


@dataclass(frozen=True)
class Resealed:
    records: int
    values: int


@dataclass(frozen=True)
class Rotated:
    key: str
    previous: str
    records: int
    values: int


async def rotate_key(store: Store, ring: KeyRing) -> Rotated:
    key_id, previous = await ring.rotate()
    done = await reseal(store, ring)
    return Rotated(key_id, previous, done.records, done.values)


async def reseal(store: Store, ring: KeyRing) -> Resealed:
    """Every value not under the current key sealed again under it: how many records and
    values were written. `KeyRefused` when records kept changing for `PASSES` passes."""
    records = values = 0
    for _ in range(PASSES):
        current = await ring.current()
        key_id = current.value.key
        listing = await store.list(keys.SECRETS, AppSecrets)
        behind = [
            item
            for item in listing.items
            if any(v.key_id != key_id for v in item.value.values.values())
        ]
        if not behind:
            if values:
                log.info("sealed %d value(s) of %d app(s) again under %s", values, records, key_id)
            return Resealed(records, values)
        for item in behind:
            fresh, moved = _resealed(ring, item.value, key_id)
            require = [Require(item.key, item.revision), Require(current.key, current.revision)]
            try:
                await store.txn(require, [Put(item.key, fresh)])
            except Conflict:  # changed meanwhile: the next pass reads it again
                continue
            records += 1
            values += moved
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


async def finish(store: Store, ring: KeyRing) -> None:
    """What a rotation left under an older key, sealed again (a control plane starting); a
    failure is logged, never raised: the values still open."""
    try:
        done = await reseal(store, ring)
    except (StoreError, SecretsError) as exc:
        log.warning("could not seal the secrets again under the current key: %s", exc)
        return
    if done.values:
        log.info("finished a rotation: %d value(s) sealed again", done.values)
