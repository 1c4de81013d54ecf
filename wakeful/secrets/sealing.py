"""Sealing one secret's value, and opening it: AES-256-GCM from `cryptography`.

Rules (tests/secrets/test_sealing.py holds each):
- A sealed value is `v1:<key id>:<urlsafe base64 of nonce(12) + ciphertext + tag(16)>`: the
  key id says which key opens it, so a rotation can leave old values under old keys and a
  restore can name the key it lacks.
- The nonce is 12 random bytes for every seal (`seal` takes it as an argument: the caller,
  `KeyRing.seal`, draws it). Under one key, 2^32 seals keep the chance of a repeat far below
  what NIST allows; a key seals far fewer (every change seals only what changed).
- The associated data is `b"wakeful secret\\0" + app + b"\\0" + name`: a sealed value copied to
  another app's record, or under another name, does not open. App and name hold no NUL (their
  patterns), so no two pairs give the same bytes.
- A registry's password (`RegistryLogin.password`) is sealed the same way under the same keys,
  with the associated data `b"wakeful registry\\0" + host`: a login copied under another
  host's key does not open, and no registry password opens as an app's secret (whose data
  starts `wakeful secret`), nor the reverse.
- A value that does not open says which app, name and key id (or which host), never anything
  of the value.
- A sandbox's placement (`Sandbox.placement`, written by the pool controller) reads
  `v1:<key id>:<urlsafe base64 of HMAC-SHA256(k, b"wakeful placement\\0" + id + \\0 + app +
  \\0 + pool + \\0 + node + \\0 + secrets generation)>`, k derived from the secrets key
  `<key id>` by HKDF-SHA256 (info `b"wakeful placement"`): never the AES key itself, so a MAC
  and a seal never share a key. Ids and names hold no NUL (their patterns) and the generation
  is decimal, so no two sets of fields give the same bytes. A placement that does not parse,
  names a key not here, or was made over other fields, does not verify; the compare is
  constant-time.

No I/O, no clock, no randomness here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from wakeful.domain.models import NONCE_BYTES, SEAL_FORMAT, SEALED_PATTERN, TAG_BYTES

from .errors import NotSealed, SealError, UnknownKey

KEY_BYTES = 32
"""AES-256."""
AD_PREFIX = b"wakeful secret\0"
REGISTRY_AD_PREFIX = b"wakeful registry\0"
PURPOSE_AD_PREFIX = b"wakeful purpose\0"
_SEALED = re.compile(SEALED_PATTERN)
PLACEMENT_INFO = b"wakeful placement"
"""HKDF's info for the placement key, and (with a NUL) the prefix of what a placement MACs."""
_PLACEMENT = re.compile(r"^v1:([0-9a-f]{12}):([A-Za-z0-9_-]{43}=)$")
"""`v1`, a key id, and the 32 bytes of an HMAC-SHA256 in urlsafe base64."""


def associated_data(app: str, name: str) -> bytes:
    """What binds a sealed value to its app and name."""
    return AD_PREFIX + app.encode() + b"\0" + name.encode()


def registry_data(host: str) -> bytes:
    """What binds a sealed registry password to its host."""
    return REGISTRY_AD_PREFIX + host.encode()


def purpose_data(purpose: str) -> bytes:
    """What binds a sealed value to what it is for (`acme certificate shop.example.com`)."""
    return PURPOSE_AD_PREFIX + purpose.encode()


def cipher(key: bytes) -> AESGCM:
    if len(key) != KEY_BYTES:
        raise ValueError(f"a secrets key is {KEY_BYTES} bytes, not {len(key)}")
    return AESGCM(key)


def seal(aead: AESGCM, key_id: str, app: str, name: str, value: str, nonce: bytes) -> str:
    """`value` sealed under `aead` (the key `key_id`), bound to `app` and `name`."""
    return seal_bound(aead, key_id, associated_data(app, name), value, nonce)


def seal_bound(aead: AESGCM, key_id: str, data: bytes, value: str, nonce: bytes) -> str:
    """`value` sealed under `aead` (the key `key_id`), bound to the associated `data`."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
    sealed = aead.encrypt(nonce, value.encode(), data)
    return f"{SEAL_FORMAT}:{key_id}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def key_id_of(sealed: str) -> str:
    """The id of the key that opens `sealed`; `NotSealed` when it is not of the shape."""
    return _split(sealed)[0]


def open_sealed(aead_for: Callable[[str], AESGCM | None], app: str, name: str, sealed: str) -> str:
    """The value `sealed` holds, opened with the key its id names (`aead_for(id)`, None when
    there is none: `UnknownKey`); `SealError` when it does not open: tampered, moved from
    another app or name, or sealed under another key of the same id."""
    return open_bound(
        aead_for, associated_data(app, name), sealed, f"{app}'s secret {name}", "app or name"
    )


def open_bound(
    aead_for: Callable[[str], AESGCM | None], data: bytes, sealed: str, what: str, bound: str
) -> str:
    """What `sealed` holds, opened with the key its id names and the associated `data`;
    `UnknownKey` or `SealError` naming `what` (`the login for registry H`), and `bound` (what
    the data binds it to, `host`) as what it may have been sealed for instead."""
    key_id, blob = _split(sealed)
    aead = aead_for(key_id)
    if aead is None:
        raise UnknownKey(key_id, f"{what} is sealed under key {key_id}, which is not here")
    try:
        plain = aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], data)
    except InvalidTag:
        raise SealError(
            f"{what} does not open under key {key_id}: it was sealed for another {bound}, "
            "changed, or sealed under another key of that id"
        ) from None
    return plain.decode()


def _split(sealed: str) -> tuple[str, bytes]:
    if not _SEALED.fullmatch(sealed):
        raise NotSealed(f"not a sealed value of format {SEAL_FORMAT} with a key id")
    _, key_id, encoded = sealed.split(":", 2)
    try:
        blob = base64.b64decode(encoded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise NotSealed(f"a sealed value under key {key_id} is not base64") from None
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise NotSealed(f"a sealed value under key {key_id} is too short to hold a tag")
    return key_id, blob


# -- placements ------------------------------------------------------------------------------


def placement_key(key: bytes) -> bytes:
    """The key placements under the secrets key `key` are made with (HKDF-SHA256)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a secrets key is {KEY_BYTES} bytes, not {len(key)}")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PLACEMENT_INFO).derive(key)


def placement_message(
    sandbox_id: str, app: str, pool: str, node: str, secrets_generation: int
) -> bytes:
    """What a placement binds: the sandbox, its app, pool and node, and the secrets generation
    it was created at."""
    fields = (sandbox_id, app, pool, node, str(secrets_generation))
    return PLACEMENT_INFO + b"\0" + b"\0".join(f.encode() for f in fields)


def place(mac_key: bytes, key_id: str, message: bytes) -> str:
    """The placement of `message` under `mac_key` (derived from the key `key_id`)."""
    mac = hmac.digest(mac_key, message, hashlib.sha256)
    return f"{SEAL_FORMAT}:{key_id}:{base64.urlsafe_b64encode(mac).decode()}"


def placement_key_id(placement: str) -> str | None:
    """The id of the key `placement` names; None when it is not of the shape."""
    found = _PLACEMENT.fullmatch(placement)
    return None if found is None else found.group(1)


def verify_placement(
    mac_key_for: Callable[[str], bytes | None], placement: str, message: bytes
) -> bool:
    """Whether `placement` was made over `message` with the key its id names (`mac_key_for`,
    None when there is no such key)."""
    found = _PLACEMENT.fullmatch(placement)
    if found is None:
        return False
    mac_key = mac_key_for(found.group(1))
    if mac_key is None:
        return False
    given = base64.urlsafe_b64decode(found.group(2))
    return hmac.compare_digest(given, hmac.digest(mac_key, message, hashlib.sha256))
