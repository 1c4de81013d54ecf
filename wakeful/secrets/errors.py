"""What the secrets component raises. No message ever holds a secret's value: they name the
app, the secret's name, a key id, a directory or a size.

    SecretsError
     ├── SealError          a sealed value that does not open (`sealing.py`)
     │    ├── NotSealed     not of the sealed shape at all
     │    └── UnknownKey    sealed under a key id this control plane was not given
     ├── KeysUnusable       the key directory cannot serve: the control plane refuses to
     │    │                 start, with this one line (`keys.py`)
     │    └── MissingKey    a key id the store needs is not in the directory
     ├── KeyRefused         rotate or retire refused: the current key, one in use (409)
     │    └── NoSuchKey     no key file of that id (404)
     ├── ChangeRefused      a set or unset refused, nothing written (`book.py`; its `kind`
     │                      says invalid 422, unknown 404, conflict 409)
     ├── NotYours           a node asked for a sandbox it is not starting (403)
     └── UnknownSandbox     no such sandbox (404)
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal


class SecretsError(Exception):
    pass


class SealError(SecretsError):
    pass


class NotSealed(SealError):
    pass


class UnknownKey(SealError):
    def __init__(self, key_id: str, message: str) -> None:
        super().__init__(message)
        self.key_id = key_id


class KeysUnusable(SecretsError):
    """The key directory cannot serve what the store holds; the message is the one line a
    control plane that refuses to start prints."""


class MissingKey(KeysUnusable):
    def __init__(self, key_id: str, directory: Path, why: str) -> None:
        super().__init__(
            f"secrets key {key_id} is not in {directory} ({why}): give this control plane the "
            "key directory the activators share (WAKEFUL_SECRETS_KEYS), or restore the key "
            f"file {key_id}.key into it"
        )
        self.key_id = key_id
        self.directory = directory


class KeyRefused(SecretsError):
    pass


class NoSuchKey(KeyRefused):
    pass


ChangeKind = Literal["invalid", "unknown", "conflict"]


class ChangeRefused(SecretsError):
    """`kind`: invalid (a name, a value or the body: 422), unknown (no such app or secret:
    404), conflict (the manifest sets the name, or the record kept changing: 409)."""

    def __init__(self, kind: ChangeKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class NotYours(SecretsError):
    pass


class UnknownSandbox(SecretsError):
    pass
