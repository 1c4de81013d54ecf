"""The secrets records and their rules (wakeful/domain/models/secrets.py): names follow `env`'s
rules, values are bounded and hold no NUL, a record holds at most 100 names, and what a refusal
says names the size, never the value."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from wakeful.domain import keys
from wakeful.domain.models import (
    MAX_SECRET_BYTES,
    MAX_SECRETS,
    MAX_SECRETS_BYTES,
    AppSecrets,
    Sandbox,
    SealedValue,
    SecretsKey,
    describe_validation_error,
    manifest_overlap,
    plain_size,
    sealed_length,
    secret_name_problem,
    secret_value_problem,
)

KEY = "0123456789ab"


def sealed_of(size: int, key: str = KEY) -> str:
    """A sealed value's shape for a plaintext of `size` bytes (not a real seal)."""
    return f"v1:{key}:" + base64.urlsafe_b64encode(bytes(12 + size + 16)).decode()


def value(size: int = 8, key: str = KEY) -> SealedValue:
    return SealedValue(sealed=sealed_of(size, key), set_at=1.0, set_by="admin")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        pytest.param("DATABASE_URL", None, id="an upper-case name with an underscore"),
        pytest.param("_private", None, id="a leading underscore"),
        pytest.param("api_key2", None, id="lower case and a digit"),
        pytest.param("2FA", "is not an environment variable name", id="a leading digit"),
        pytest.param("API-KEY", "is not an environment variable name", id="a dash"),
        pytest.param("A B", "is not an environment variable name", id="a space"),
        pytest.param("", "is not an environment variable name", id="empty"),
        pytest.param("NL\n", "is not an environment variable name", id="a trailing newline"),
        pytest.param("PORT", "is set by wakeful", id="PORT is wakeful's"),
        pytest.param("HOST", "is set by wakeful", id="HOST is wakeful's"),
        pytest.param("A" * 255, None, id="255 characters"),
        pytest.param("A" * 256, "is longer than 255 characters", id="256 characters"),
    ],
)
def test_secret_name_problem(name: str, problem: str | None) -> None:
    found = secret_name_problem(name)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("", None, id="empty is a value"),
        pytest.param("x" * MAX_SECRET_BYTES, None, id="32 KiB of ASCII"),
        pytest.param("é" * (MAX_SECRET_BYTES // 2), None, id="32 KiB of two-byte characters"),
        pytest.param("x" * (MAX_SECRET_BYTES + 1), "is 32769 bytes", id="one byte past 32 KiB"),
        pytest.param(
            "é" * (MAX_SECRET_BYTES // 2 + 1), "is 32770 bytes", id="counted in UTF-8 bytes"
        ),
        pytest.param("pass\0word", "holds a NUL", id="a NUL"),
        pytest.param("line\nnext\ttab", None, id="newlines and tabs are kept"),
        pytest.param("\ud800", "holds a lone surrogate", id="a lone surrogate is not text"),
    ],
)
def test_secret_value_problem(text: str, problem: str | None) -> None:
    found = secret_value_problem(text)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)
        assert text not in found or text == ""  # the value is never quoted


@pytest.mark.parametrize(
    ("size"), [0, 1, 2, 3, 4, 100, MAX_SECRET_BYTES], ids=lambda size: f"{size} bytes"
)
def test_a_sealed_values_length_says_its_plaintexts_size(size: int) -> None:
    sealed = sealed_of(size)
    assert len(sealed) == sealed_length(size)
    assert plain_size(sealed) == size


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        pytest.param({f"S{n}": value() for n in range(MAX_SECRETS)}, None, id="100 names"),
        pytest.param(
            {f"S{n}": value() for n in range(MAX_SECRETS + 1)},
            "at most 100 items",
            id="101 names",
        ),
        pytest.param({"PORT": value()}, "secret 'PORT' is set by wakeful", id="PORT refused"),
        pytest.param({"9LIVES": value()}, "secret '9LIVES' is not", id="a bad name refused"),
        pytest.param(
            {f"S{n}": value(MAX_SECRET_BYTES) for n in range(16)},
            None,
            id="16 values of 32 KiB fill the record",
        ),
        pytest.param(
            {f"S{n}": value(MAX_SECRET_BYTES) for n in range(17)},
            f"the values come to {17 * MAX_SECRET_BYTES} bytes",
            id="a 17th is past the bound on one app's values",
        ),
    ],
)
def test_what_an_apps_secrets_record_holds(
    values: dict[str, SealedValue], problem: str | None
) -> None:
    if problem is None:
        record = AppSecrets(app="hello", values=values)
        assert sum(plain_size(v.sealed) for v in record.values.values()) <= MAX_SECRETS_BYTES
        return
    with pytest.raises(ValidationError) as refused:
        AppSecrets(app="hello", values=values)
    assert problem in describe_validation_error(refused.value)


@pytest.mark.parametrize(
    ("sealed"),
    [
        pytest.param("hunter2", id="plaintext"),
        pytest.param("v2:0123456789ab:AAAA", id="another format"),
        pytest.param("v1:0123456789:AAAA", id="a short key id"),
        pytest.param("v1:0123456789ab:AA+A/", id="not urlsafe base64"),
        pytest.param(sealed_of(MAX_SECRET_BYTES + 1), id="longer than the largest value"),
    ],
)
def test_a_value_not_sealed_is_refused(sealed: str) -> None:
    with pytest.raises(ValidationError):
        SealedValue(sealed=sealed, set_at=1.0, set_by="admin")


def test_a_sealed_value_names_its_key_and_generations_only_move_with_changes() -> None:
    assert value(key="fedcba987654").key_id == "fedcba987654"
    with pytest.raises(ValidationError, match="cannot pass generation"):
        AppSecrets(app="hello", generation=1, restart_generation=2)
    with pytest.raises(ValidationError):
        SecretsKey(key="not-hex-at-all")
    assert Sandbox(id="s-1", pool="hello-v1", app="hello").secrets_generation == 0
    assert keys.secrets("hello") == "secrets/hello"
    assert keys.secrets("hello").startswith(keys.SECRETS)
    assert keys.SECRETS_KEY == "meta/secrets-key"


@pytest.mark.parametrize(
    ("env", "names", "both"),
    [
        pytest.param({"A": "1"}, ["B"], [], id="apart"),
        pytest.param({"A": "1", "B": "2"}, ["B", "C"], ["B"], id="one name in both"),
        pytest.param({}, ["B"], [], id="no env"),
        pytest.param({"Z": "", "A": ""}, ["A", "Z"], ["A", "Z"], id="all of them, in order"),
    ],
)
def test_manifest_overlap(env: dict[str, str], names: list[str], both: list[str]) -> None:
    assert manifest_overlap(env, names) == both
