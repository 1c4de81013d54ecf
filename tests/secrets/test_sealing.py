"""Sealing (wakeful/secrets/sealing.py): a sealed value names its key, opens only under that
key for the same app and name, and no refusal shows a byte of the value; a placement verifies
only over the fields it was made for, under the key its id names."""

from __future__ import annotations

import base64
import re

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakeful.domain.models import SEALED_PATTERN, sealed_length
from wakeful.secrets.errors import NotSealed, SealError, UnknownKey
from wakeful.secrets.sealing import (
    associated_data,
    cipher,
    key_id_of,
    open_sealed,
    place,
    placement_key,
    placement_key_id,
    placement_message,
    seal,
    verify_placement,
)

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


# -- placements ------------------------------------------------------------------------------

PLACING = placement_key(b"k" * 32)
FIELDS = ("web-v1-0a1b", "web", "web-v1", "n1", 3)
PLACEMENT = place(PLACING, KEY_ID, placement_message(*FIELDS))


def test_the_placement_key_is_derived_never_the_secrets_key_itself() -> None:
    assert len(PLACING) == 32 and PLACING != b"k" * 32
    assert placement_key(b"k" * 32) == PLACING  # the same for every activator with the key
    assert placement_key(b"j" * 32) != PLACING
    with pytest.raises(ValueError, match="32 bytes, not 16"):
        placement_key(b"k" * 16)


def test_a_placement_names_its_key() -> None:
    assert re.fullmatch(r"v1:0123456789ab:[A-Za-z0-9_-]{43}=", PLACEMENT)
    assert placement_key_id(PLACEMENT) == KEY_ID


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("v1:0123456789ab", id="no MAC"),
        pytest.param("v2" + PLACEMENT[2:], id="another format"),
        pytest.param("v1:0123456789AB" + PLACEMENT[15:], id="an upper-case key id"),
        pytest.param(PLACEMENT[:-2] + "=", id="a MAC cut short"),
        pytest.param(PLACEMENT + "AAAA", id="a MAC too long"),
        pytest.param(PLACEMENT.replace("=", "+"), id="not urlsafe base64"),
        pytest.param(" " + PLACEMENT, id="a space before"),
    ],
)
def test_a_placement_not_of_the_shape_names_no_key_and_does_not_verify(text: str) -> None:
    assert placement_key_id(text) is None
    assert not verify_placement({KEY_ID: PLACING}.get, text, placement_message(*FIELDS))


@pytest.mark.parametrize(
    ("fields", "keys", "verifies"),
    [
        pytest.param(FIELDS, {KEY_ID: PLACING}, True, id="the fields it was made for"),
        pytest.param(("web-v1-ffff", *FIELDS[1:]), {KEY_ID: PLACING}, False, id="another id"),
        pytest.param((FIELDS[0], "api", *FIELDS[2:]), {KEY_ID: PLACING}, False, id="another app"),
        pytest.param((*FIELDS[:2], "web-v2", *FIELDS[3:]), {KEY_ID: PLACING}, False, id="pool"),
        pytest.param((*FIELDS[:3], "n2", 3), {KEY_ID: PLACING}, False, id="another node"),
        pytest.param((*FIELDS[:4], 4), {KEY_ID: PLACING}, False, id="a later generation"),
        pytest.param((*FIELDS[:4], 33), {KEY_ID: PLACING}, False, id="a generation with a digit"),
        pytest.param(FIELDS, {}, False, id="its key not here"),
        pytest.param(FIELDS, {KEY_ID: placement_key(b"j" * 32)}, False, id="another key, same id"),
        pytest.param(FIELDS, {OTHER_ID: PLACING}, False, id="the key here under another id"),
    ],
)
def test_a_placement_verifies_only_over_its_fields_under_its_key(
    fields: tuple[str, str, str, str, int], keys: dict[str, bytes], verifies: bool
) -> None:
    assert verify_placement(keys.get, PLACEMENT, placement_message(*fields)) is verifies


@pytest.mark.parametrize(
    ("one", "other"),
    [
        pytest.param(("a-1", "bc", "p", "n", 1), ("a-1", "b", "cp", "n", 1), id="app and pool"),
        pytest.param(("a-1", "b", "p", "n1", 1), ("a-1", "b", "p", "n", 11), id="node and gen"),
    ],
)
def test_no_two_sets_of_fields_give_the_same_message(
    one: tuple[str, str, str, str, int], other: tuple[str, str, str, str, int]
) -> None:
    assert placement_message(*one) != placement_message(*other)


def test_a_placement_flipped_by_a_bit_does_not_verify() -> None:
    mac = bytearray(base64.urlsafe_b64decode(PLACEMENT.rsplit(":", 1)[1]))
    mac[0] ^= 1
    flipped = f"v1:{KEY_ID}:{base64.urlsafe_b64encode(bytes(mac)).decode()}"
    assert not verify_placement({KEY_ID: PLACING}.get, flipped, placement_message(*FIELDS))
