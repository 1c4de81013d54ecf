"""Registries' logins: the username and password the control plane pulls a private registry's
images with at deploy. Set and listed by the admin, opened only for an import, never given to
a node (nodes fetch blobs from the control plane).

Theory of operation:
- **A login** (`login`) is checked whole first (the host, the username, the password:
  `read_login`, `registry_host`), then its password sealed under the current secrets key,
  bound to the host (`KeyRing.seal_login`), and `registries/{host}` written in one transaction
  that requires that record and `meta/secrets-key` at the revisions read: a concurrent login
  or a rotation makes it read and decide again, so nothing is sealed under a key a rotation
  just replaced. A login to what it already is stays as it is.
- **A rotation** seals every login again with the apps' secrets (`rotation.reseal`); `check`
  refuses a control plane a key a login is sealed under, and `retire` a key one still is.
- **At deploy** (`credentials`), the image reference's registry domain names the record; its
  password is opened for that import alone and handed to skopeo in a private auth file
  (`wakeful.oci.skopeo`). A login that does not open is `LoginUnusable` (503), never a pull
  without it.
- **A listing** holds hosts, usernames, when and by whom: never a password. No answer, log line
  or exception message here holds one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wakeful.domain import keys
from wakeful.domain.models import (
    RegistryLogin,
    normal_registry_host,
    password_problem,
    registry_host_problem,
    username_problem,
)
from wakeful.oci import Credentials, LoginUnusable
from wakeful.store import Conflict, Put, Require, Store

from .errors import ChangeRefused, KeysUnusable, SealError
from .keys import KeyRing
from .rules import json_kind

log = logging.getLogger(__name__)

ATTEMPTS = 20
FIELDS = ("username", "password")


@dataclass(frozen=True)
class Login:
    """What a login asks for; the password never printed."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class LoginEntry:
    """A login as listed: never its password."""

    host: str
    username: str
    set_at: float
    set_by: str
    key_id: str
    """The key its password is sealed under."""
    changed: bool = True
    """Whether the login that answered this wrote it (False: already so)."""


def registry_host(text: str) -> str:
    """`text` as a login's host (lowercase, Docker Hub's aliases as `docker.io`);
    `ChangeRefused("invalid")` naming the field and the host."""
    host = normal_registry_host(text)
    problem = registry_host_problem(host)
    if problem is not None:
        raise ChangeRefused("invalid", f"host: {text[:80]!r} {problem}")
    return host


def read_login(body: object) -> Login:
    """What `PUT /v1/registries/{host}` asks for: `{"username": U, "password": P}`.
    `ChangeRefused("invalid")` naming the field and, for the password, its size: never it."""
    if not isinstance(body, dict):
        raise ChangeRefused(
            "invalid",
            f"the body must be a JSON object with username and password, not {json_kind(body)}",
        )
    stray = sum(1 for key in body if key not in FIELDS)
    if stray:  # not named: what was sent as a field may be a password
        raise ChangeRefused(
            "invalid",
            f"{stray} field(s) other than username and password, not named here (what was "
            "sent as a field may be a password)",
        )
    username, password = body.get("username"), body.get("password")
    if not isinstance(username, str):
        raise ChangeRefused("invalid", f"username: must be a string, not {json_kind(username)}")
    problem = username_problem(username)
    if problem is not None:
        raise ChangeRefused("invalid", f"username: the username {problem}")
    if not isinstance(password, str):
        raise ChangeRefused("invalid", f"password: must be a string, not {json_kind(password)}")
    problem = password_problem(password)
    if problem is not None:
        raise ChangeRefused("invalid", f"password: the password {problem}")
    return Login(username, password)


def _entry(login: RegistryLogin, changed: bool = True) -> LoginEntry:
    return LoginEntry(login.host, login.username, login.set_at, login.set_by, login.key_id, changed)


class RegistryBook:
    def __init__(
        self, store: Store, ring: KeyRing, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._ring = ring
        self._clock = clock

    async def login(self, host: str, login: Login, *, by: str) -> LoginEntry:
        """`host`'s login set (replacing any), or refused with nothing written
        (`ChangeRefused`). `host` and `login` are checked here too (the CLI's import, say)."""
        host = registry_host(host)
        read_login({"username": login.username, "password": login.password})
        for _ in range(ATTEMPTS):
            key = await self._ring.current()
            found = await self._store.get(keys.registry(host), RegistryLogin)
            if found is not None and self._holds(found.value, login, key.value.key):
                return _entry(found.value, changed=False)
            written = RegistryLogin(
                host=host,
                username=login.username,
                password=self._ring.seal_login(key.value.key, host, login.password),
                set_at=self._clock(),
                set_by=by,
            )
            require = [
                Require(keys.registry(host), found.revision if found is not None else 0),
                Require(key.key, key.revision),
            ]
            try:
                await self._store.txn(require, [Put(keys.registry(host), written)])
            except Conflict:
                continue
            log.info("registry login for %s set: user %s, by %s", host, login.username, by)
            return _entry(written)
        raise ChangeRefused("conflict", f"the login for registry {host} kept changing; try again")

    def _holds(self, record: RegistryLogin, login: Login, key_id: str) -> bool:
        if record.username != login.username or record.key_id != key_id:
            return False
        try:
            return self._ring.open_login(record.host, record.password) == login.password
        except SealError:
            return False

    async def logout(self, host: str) -> str:
        """`host`'s login deleted: its normal form; `ChangeRefused("unknown")` for none."""
        host = registry_host(host)
        if not await self._store.delete(keys.registry(host)):
            raise ChangeRefused("unknown", f"no login for registry {host}")
        log.info("registry login for %s removed", host)
        return host

    async def listing(self) -> list[LoginEntry]:
        """Hosts, usernames, when and by whom: never a password."""
        found = await self._store.list(keys.REGISTRIES, RegistryLogin)
        return sorted((_entry(item.value) for item in found.items), key=lambda e: e.host)

    async def credentials(self, domain: str) -> Credentials | None:
        """The login for the registry `domain` (an image reference's, `host[:port]`), opened
        for one import; None when there is none. `LoginUnusable` when there is one and it
        does not open: a pull without it would fail less clearly."""
        host = normal_registry_host(domain)
        if registry_host_problem(host) is not None:
            return None  # no login can name it (an IPv6 address)
        found = await self._store.get(keys.registry(host), RegistryLogin)
        if found is None:
            return None
        try:
            password = self._ring.open_login(host, found.value.password)
        except (SealError, KeysUnusable) as exc:
            raise LoginUnusable(f"the login for registry {host} cannot be used: {exc}") from None
        return Credentials(found.value.username, password)
