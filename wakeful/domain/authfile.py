"""The auth file podman, skopeo and docker keep their registry logins in, read for
`wakeful registry import FILE`: `{"auths": {KEY: {"auth": base64(USER:PASSWORD)}}}` (podman's
`auth.json`, docker's `config.json`).

Rules (tests/wakeful/test_registry_cli.py holds each):
- KEY is a registry host (`registry.example.com:5000`), or docker's legacy URL
  (`https://index.docker.io/v1/`): its host is taken. A key naming a repository
  (`quay.io/team`, podman's per-repository login) is skipped: a login here is per host.
- `auth` is base64 of `USER:PASSWORD`, split at the first `:`. An entry with no `auth`
  (docker's `identitytoken`, or one a credential helper holds: `credsStore`, `credHelpers`)
  is skipped, named, never read further.
- Hosts are normalised as a login's are (`normal_registry_host`); two keys for one host
  with different logins are refused.
- The whole file is read and checked before anything is written; every refusal names the
  key and the field, never a password nor the `auth` text.

Pure: the caller reads the file.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

from .models import (
    normal_registry_host,
    password_problem,
    registry_host_problem,
    username_problem,
)

MAX_FILE_BYTES = 1 << 20


class AuthFileError(ValueError):
    """The file cannot be imported; one line naming the key and the field."""


@dataclass(frozen=True)
class FileLogin:
    host: str
    username: str
    password: str = field(repr=False)
    key: str
    """The key it was read from, as the file has it."""


@dataclass(frozen=True)
class AuthFile:
    logins: list[FileLogin]
    skipped: list[str]
    """Why each entry not imported was skipped, one line each."""


def key_host(key: str) -> str | None:
    """The registry host a key names (lowercase), or None when it names a repository."""
    text = key.strip()
    for scheme in ("https://", "http://"):
        if text.lower().startswith(scheme):
            return normal_registry_host(text[len(scheme) :].partition("/")[0])
    if "/" in text:
        return None
    return normal_registry_host(text)


def read_auth_file(text: str) -> AuthFile:
    """The logins in an auth file's `text`; `AuthFileError` when it cannot be imported."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise AuthFileError('not JSON: expected {"auths": {HOST: {"auth": ...}}}') from None
    if not isinstance(data, dict) or not isinstance(data.get("auths"), dict):
        raise AuthFileError('no "auths" object: expected {"auths": {HOST: {"auth": ...}}}')
    logins: dict[str, FileLogin] = {}
    skipped: list[str] = []
    for key, entry in data["auths"].items():
        shown = repr(key[:80])
        host = key_host(key)
        if host is None:
            skipped.append(f"{shown}: a login per repository; wakeful logs in per host")
            continue
        problem = registry_host_problem(host)
        if problem is not None:
            raise AuthFileError(f"auths.{shown}: the host {problem}")
        if not isinstance(entry, dict):
            raise AuthFileError(f"auths.{shown}: must be an object")
        auth = entry.get("auth")
        if not auth:
            skipped.append(
                f'{shown}: no "auth" (an identity token, or a credential helper\'s); log in '
                "with `wakeful registry login` instead"
            )
            continue
        username, password = _decoded(shown, auth)
        login = FileLogin(host, username, password, key)
        before = logins.get(host)
        if before is not None and (before.username, before.password) != (username, password):
            raise AuthFileError(
                f"auths.{shown} and auths.{before.key[:80]!r} are both logins for {host}, "
                "different ones: keep one"
            )
        logins[host] = login
    if data.get("credsStore") or data.get("credHelpers"):
        skipped.append("credsStore/credHelpers: logins a credential helper holds are not read")
    return AuthFile(sorted(logins.values(), key=lambda login: login.host), skipped)


def _decoded(shown: str, auth: object) -> tuple[str, str]:
    """`auth` as (username, password); `AuthFileError` naming the key, never the text."""
    if not isinstance(auth, str):
        raise AuthFileError(f"auths.{shown}.auth: must be a base64 string")
    try:
        plain = base64.b64decode(auth, validate=True).decode()
    except (binascii.Error, ValueError):
        raise AuthFileError(f"auths.{shown}.auth: not base64 of USER:PASSWORD text") from None
    username, colon, password = plain.partition(":")
    if not colon:
        raise AuthFileError(f"auths.{shown}.auth: holds no ':' between user and password")
    problem = username_problem(username)
    if problem is not None:
        raise AuthFileError(f"auths.{shown}.auth: the username {problem}")
    problem = password_problem(password)
    if problem is not None:
        raise AuthFileError(f"auths.{shown}.auth: the password {problem}")
    return username, password
