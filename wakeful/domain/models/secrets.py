"""App secrets at rest: each value sealed with AES-GCM under a key of the control plane's
(`wakeful.secrets`), never in plaintext, and the id of the key new values are sealed under.

| key                | model      |
|--------------------|------------|
| `secrets/{app}`    | AppSecrets |
| `meta/secrets-key` | SecretsKey |

A sealed value reads `v1:<key id>:<urlsafe base64 of nonce(12) + ciphertext + tag(16)>`: the
key id says which key opens it, and its length says how long the plaintext is. Secrets belong
to an app, not to a version: a rollback does not bring old values back.

The rules on names and values are here (pure, for the control API and the CLI alike); what a
refusal says names the field and the value's size, never the value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Self

from pydantic import Field, StringConstraints, field_validator, model_validator

from wakeful.domain.models.apps import ENV_NAME, RESERVED_ENV
from wakeful.domain.models.base import Model, Name

MAX_SECRETS = 100
"""Names one app may have."""
MAX_SECRET_BYTES = 32 * 1024
"""The largest value, in bytes of UTF-8."""
MAX_SECRETS_BYTES = 512 * 1024
"""All of one app's values together, in bytes of UTF-8: the sealed record stays well under
the store's bound on a value (1 MiB), and the environment under what `execve` takes."""
MAX_SECRET_NAME = 255
"""The longest name, in characters."""

KEY_ID_PATTERN = r"^[0-9a-f]{12}$"
"""A secrets key's id: 12 hex digits (6 random bytes), also its file's name in the key
directory (`<id>.key`)."""
SEAL_FORMAT = "v1"
NONCE_BYTES = 12
TAG_BYTES = 16
SEALED_PATTERN = r"^v1:[0-9a-f]{12}:[A-Za-z0-9_-]+={0,2}$"


def sealed_length(size: int) -> int:
    """The length of a sealed value whose plaintext is `size` bytes."""
    blob = NONCE_BYTES + size + TAG_BYTES
    return len(SEAL_FORMAT) + 1 + 12 + 1 + 4 * -(-blob // 3)


def plain_size(sealed: str) -> int:
    """The plaintext's size in bytes, read from a sealed value's length (no key needed)."""
    encoded = sealed.rsplit(":", 1)[-1]
    padding = len(encoded) - len(encoded.rstrip("="))
    return max(0, len(encoded) * 3 // 4 - padding - NONCE_BYTES - TAG_BYTES)


def secret_name_problem(name: str) -> str | None:
    """Why `name` cannot name a secret, or None: the rules of `env` in wakeful.toml."""
    if len(name) > MAX_SECRET_NAME:
        return f"is longer than {MAX_SECRET_NAME} characters"
    if not ENV_NAME.fullmatch(name):
        return "is not an environment variable name (letters, digits and _, not first a digit)"
    if name in RESERVED_ENV:
        return "is set by wakeful for every sandbox and cannot be a secret"
    return None


def secret_value_problem(value: str) -> str | None:
    """Why `value` cannot be a secret's value, or None. Says its size, never its text."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "holds a lone surrogate (such as \\ud800 in JSON), which is not text"
    if size > MAX_SECRET_BYTES:
        return f"is {size} bytes; a secret holds at most {MAX_SECRET_BYTES}"
    if "\0" in value:
        return "holds a NUL character, which no environment variable can"
    return None


def manifest_overlap(env: Iterable[str], names: Iterable[str]) -> list[str]:
    """The names both a manifest's `env` and an app's secrets set, in order: refused, so an
    app never has two values for one variable."""
    return sorted(set(env) & set(names))


SealedText = Annotated[
    str, StringConstraints(pattern=SEALED_PATTERN, max_length=sealed_length(MAX_SECRET_BYTES))
]


class SealedValue(Model):
    """One secret's value as stored: sealed, with when and by which token it was set."""

    sealed: SealedText
    set_at: float
    set_by: Name
    """The name of the token that set it (`admin` for the admin token)."""

    @property
    def key_id(self) -> str:
        """The id of the key that opens it."""
        return self.sealed.split(":", 2)[1]


class AppSecrets(Model):
    """An app's secrets (`secrets/{app}`), written by compare-and-set only. The record stays
    when its last value is unset, so its generations never go back (a sandbox started before
    the unset is still behind); the app's deletion removes it."""

    app: Name
    values: dict[str, SealedValue] = Field(default_factory=dict, max_length=MAX_SECRETS)
    generation: int = Field(default=0, ge=0)
    """+1 on every change (set or unset)."""
    restart_generation: int = Field(default=0, ge=0)
    """+1 on every change that restarts the app's sandboxes (not `--no-restart`): a sandbox
    created at a lower one (`Sandbox.secrets_generation`) is replaced."""

    @field_validator("values")
    @classmethod
    def _names(cls, values: dict[str, SealedValue]) -> dict[str, SealedValue]:
        for name in values:
            problem = secret_name_problem(name)
            if problem is not None:
                raise ValueError(f"secret {name!r} {problem}")
        total = sum(plain_size(value.sealed) for value in values.values())
        if total > MAX_SECRETS_BYTES:
            raise ValueError(
                f"the values come to {total} bytes; an app's secrets hold at most "
                f"{MAX_SECRETS_BYTES}"
            )
        return values

    @model_validator(mode="after")
    def _generations(self) -> Self:
        if self.restart_generation > self.generation:
            raise ValueError(
                f"restart_generation ({self.restart_generation}) cannot pass generation "
                f"({self.generation}): only a change restarts"
            )
        return self


class SecretsKey(Model):
    """The key new values are sealed under (`meta/secrets-key`): its id, the file
    `<id>.key` in every activator's key directory (`WAKEFUL_SECRETS_KEYS`). Kept in the store
    so that activators sharing the directory agree."""

    key: Annotated[str, StringConstraints(pattern=KEY_ID_PATTERN)]
    since: float = 0.0
