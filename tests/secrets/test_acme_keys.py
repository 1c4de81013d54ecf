"""Keys from ACME under the secrets' keys (`PurposeSealer`, `rotation`, `KeyRing.check`): each
sealed bound to what it is for, sealed again by a rotation, counted by a retire, and checked
by a control plane starting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wakeful.domain import keys
from wakeful.domain.models import (
    ACCOUNT_PURPOSE,
    AcmeAccount,
    App,
    CertKey,
    cert_key_purpose,
)
from wakeful.secrets.book import SecretBook
from wakeful.secrets.errors import KeyRefused, MissingKey, SealError
from wakeful.secrets.keys import KeyRing
from wakeful.secrets.purposes import PurposeSealer
from wakeful.secrets.rotation import reseal
from wakeful.store import Store

pytestmark = pytest.mark.anyio
NAME = "shop.test"
KEY = "-----BEGIN PRIVATE KEY-----\nnot a real one\n-----END PRIVATE KEY-----\n"
ACCOUNT_KEY = "-----BEGIN PRIVATE KEY-----\nthe account's\n-----END PRIVATE KEY-----\n"


async def sealed_records(store: Store, directory: Path) -> tuple[SecretBook, PurposeSealer]:
    ring = KeyRing(store, directory)
    await ring.start()
    sealer = PurposeSealer(ring)
    sealed = await sealer.seal(cert_key_purpose(NAME), KEY)
    await store.put(keys.cert_key(NAME), CertKey(name=NAME, serial="1", key=sealed))
    account = AcmeAccount(
        directory="https://acme.test/dir",
        email="ops@shop.test",
        uri="https://acme.test/acct/1",
        key=await sealer.seal(ACCOUNT_PURPOSE, ACCOUNT_KEY),
    )
    await store.put(keys.ACME_ACCOUNT, account)
    return SecretBook(store, ring), sealer


async def test_a_key_opens_only_for_its_own_name(store: Store, tmp_path: Path) -> None:
    _, sealer = await sealed_records(store, tmp_path / "keys")
    found = await store.get(keys.cert_key(NAME), CertKey)
    assert found is not None
    sealed = found.value.key
    assert KEY not in sealed
    assert sealer.open(cert_key_purpose(NAME), sealed) == KEY
    with pytest.raises(SealError, match="does not open"):
        sealer.open(cert_key_purpose("other.test"), sealed)
    with pytest.raises(SealError, match="does not open"):
        sealer.open(ACCOUNT_PURPOSE, sealed)


async def test_a_rotation_seals_them_again_and_a_retire_waits_for_them(
    store: Store, tmp_path: Path
) -> None:
    secrets, sealer = await sealed_records(store, tmp_path / "keys")
    second, first = await secrets.ring.rotate()  # the key alone: nothing sealed again yet
    with pytest.raises(KeyRefused, match=re.escape(f"acme certificate {NAME}")):
        await secrets.ring.retire(first)
    done = await reseal(store, secrets.ring)
    assert (done.values, done.logins, done.acme) == (0, 0, 2)
    cert = await store.get(keys.cert_key(NAME), CertKey)
    account = await store.get(keys.ACME_ACCOUNT, AcmeAccount)
    assert cert is not None and account is not None
    assert cert.value.key_id == second and account.value.key_id == second
    await secrets.ring.retire(first)
    assert sealer.open(cert_key_purpose(NAME), cert.value.key) == KEY
    assert sealer.open(ACCOUNT_PURPOSE, account.value.key) == ACCOUNT_KEY
    rotated = await secrets.rotate_key()
    assert (rotated.previous, rotated.acme) == (second, 2)


async def test_a_control_plane_missing_the_key_they_are_sealed_under_does_not_start(
    store: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    secrets, _ = await sealed_records(store, directory)
    first = (await secrets.ring.current()).value.key
    await secrets.ring.rotate()  # current now; the keys from ACME are still under the first
    (directory / f"{first}.key").unlink()
    with pytest.raises(MissingKey) as refused:
        await KeyRing(store, directory).start()
    assert refused.value.key_id == first
    assert "acme" in str(refused.value) and KEY not in str(refused.value)


async def test_an_account_record_that_does_not_validate_stops_no_start_and_no_rotation(
    store: Store, tmp_path: Path
) -> None:
    """Written by something else (a newer wakeful, a hand): never a reason for a control plane
    not to start, with ACME on or off; the certificate manager makes a new account."""
    await store.put(keys.ACME_ACCOUNT, App(name="not-an-account"))
    ring = KeyRing(store, tmp_path / "keys")
    await ring.start()
    done = await reseal(store, ring)
    assert done.acme == 0
