"""Sealing (wakeful/secrets/sealing.py): a sealed value names its key, opens only under that
key for the same app and name, and no refusal shows a byte of the value."""

from __future__ import annotations

import base64
import re

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakeful.domain.models import SEALED_PATTERN, sealed_length
from wakeful.secrets.errors import NotSealed, SealError, UnknownKey
from wakeful.secrets.sealing import associated_data, cipher, key_id_of, open_sealed, seal

KEY_ID = "0123456789ab"
OTHER_ID = "ba9876543210"
VALUE = "hunter2-correct-horse"
AEAD = AESGCM(b"k" * 32)
NONCE = b"n" * 12


def sealed(app: str = "web", name: str = "DB_PASSWORD", value: str = VALUE) -> str:
    return seal(AEAD, KEY_ID, app, name, value, NONCE)


def only(key_id: str, aead: AESGCM = AEAD) -> dict[str, AESGCM]:
    return {key_id: aead}


def test_a_sealed_value_names_its_key_and_holds_no_plaintext() -> None:
    text = sealed()
    assert re.fullmatch(SEALED_PATTERN, text)
    assert text.startswith(f"v1:{KEY_ID}:")
    assert key_id_of(text) == KEY_ID
    assert VALUE not in text and VALUE.encode() not in base64.urlsafe_b64decode(text[16:])
    assert len(text) == sealed_length(len(VALUE.encode()))
    assert open_sealed(only(KEY_ID).get, "web", "DB_PASSWORD", text) == VALUE


def test_the_associated_data_binds_app_and_name() -> None:
    assert associated_data("web", "A") == b"wakeful secret\0web\0A"


@pytest.mark.parametrize(
    ("app", "name"),
    [
        pytest.param("api", "DB_PASSWORD", id="moved to another app's record does not open"),
        pytest.param("web", "API_KEY", id="moved under another name does not open"),
        pytest.param("webd", "B_PASSWORD", id="a shifted boundary between app and name"),
    ],
)
def test_a_sealed_value_moved_elsewhere_does_not_open(app: str, name: str) -> None:
    with pytest.raises(SealError) as refused:
        open_sealed(only(KEY_ID).get, app, name, sealed())
    assert KEY_ID in str(refused.value) and name in str(refused.value)
    assert VALUE not in str(refused.value)


def flip(text: str, at: int) -> str:
    head, blob = text.rsplit(":", 1)
    raw = bytearray(base64.urlsafe_b64decode(blob))
    raw[at] ^= 1
    return f"{head}:{base64.urlsafe_b64encode(bytes(raw)).decode()}"


@pytest.mark.parametrize(
    ("tamper", "raised"),
    [
        pytest.param(lambda t: flip(t, 0), SealError, id="a nonce bit flipped"),
        pytest.param(lambda t: flip(t, 14), SealError, id="a ciphertext bit flipped"),
        pytest.param(lambda t: flip(t, -1), SealError, id="a tag bit flipped"),
        pytest.param(lambda t: t.replace(KEY_ID, OTHER_ID), UnknownKey, id="a key id not held"),
        pytest.param(lambda t: t[:30], NotSealed, id="cut short of a tag"),
        pytest.param(lambda t: "v2" + t[2:], NotSealed, id="another format"),
        pytest.param(lambda t: t[:-3] + "!!!", NotSealed, id="not base64"),
    ],
)
def test_a_tampered_value_does_not_open(tamper: object, raised: type[Exception]) -> None:
    assert callable(tamper)
    with pytest.raises(raised) as refused:
        open_sealed(only(KEY_ID).get, "web", "DB_PASSWORD", tamper(sealed()))
    assert VALUE not in str(refused.value)


def test_under_another_key_of_the_same_id_it_does_not_open() -> None:
    with pytest.raises(SealError, match=f"does not open under key {KEY_ID}"):
        open_sealed(only(KEY_ID, AESGCM(b"x" * 32)).get, "web", "DB_PASSWORD", sealed())


def test_each_seal_draws_its_own_nonce_so_two_seals_differ() -> None:
    assert sealed() != seal(AEAD, KEY_ID, "web", "DB_PASSWORD", VALUE, b"m" * 12)


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64], ids=lambda n: f"a key of {n} bytes")
def test_a_key_of_the_wrong_size_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"32 bytes, not {size}"):
        cipher(b"k" * size)


@pytest.mark.parametrize("value", ["", "é ✓ 🔑", "x" * 32 * 1024], ids=["empty", "utf-8", "32 KiB"])
def test_any_text_round_trips(value: str) -> None:
    text = sealed(value=value)
    assert open_sealed(only(KEY_ID).get, "web", "DB_PASSWORD", text) == value
    assert len(text) == sealed_length(len(value.encode()))
