"""Registry logins: the username and password the control plane pulls a private registry's
images with, one record per registry host, the password sealed with AES-GCM under the
secrets' keys (`wakeful.secrets`), never in plaintext.

| key                 | model         |
|---------------------|---------------|
| `registries/{host}` | RegistryLogin |

A host is what an image reference names before its first `/` (`registry.example.com`,
`127.0.0.1:5000`, `docker.io`), in lowercase: a DNS name or an IPv4 address, with an optional
port. The rules are here (pure, for the control API and the CLI alike); what a refusal says
names the field and, for a password, its size: never the password.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints, field_validator

from .base import Model, Name
from .secrets import SEALED_PATTERN, sealed_length

MAX_HOST = 253 + 6
"""A DNS name's bound, and `:65535`."""
MAX_USERNAME = 255
MAX_PASSWORD_BYTES = 16 * 1024
"""Room for the long ones: a cloud's JSON key (`_json_key`) or a registry's session token."""
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
REGISTRY_HOST_PATTERN = rf"^{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?$"
_HOST = re.compile(REGISTRY_HOST_PATTERN)
DOCKER_HUB = "docker.io"
"""What a reference without a registry names, and where `index.docker.io` logins go."""
_HUB_ALIASES = frozenset({"index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"})


def normal_registry_host(host: str) -> str:
    """`host` as records are keyed: lowercase, Docker Hub's aliases as `docker.io` (what an
    image reference without a registry names)."""
    lowered = host.lower()
    return DOCKER_HUB if lowered in _HUB_ALIASES else lowered


def registry_host_problem(host: str) -> str | None:
    """Why `host` (already normalised) cannot name a registry, or None."""
    if not host:
        return "is empty"
    if len(host) > MAX_HOST:
        return f"is longer than {MAX_HOST} characters"
    if "://" in host or "/" in host:
        return "is a URL or a path; give the registry's host alone (registry.example.com:5000)"
    if host.startswith("["):
        return "is an IPv6 address, which a login cannot name yet; give the registry a DNS name"
    if not _HOST.fullmatch(host):
        return (
            "is not a registry host: a DNS name or an IPv4 address (letters, digits, '-' and "
            "'.'), with an optional :PORT"
        )
    _, colon, port = host.partition(":")
    if colon and not 0 < int(port) < 65536:
        return f"has port {port}, outside 1 to 65535"
    return None


def username_problem(username: str) -> str | None:
    """Why `username` cannot log in to a registry, or None (it is shown in listings, so it
    holds no control character)."""
    if not username:
        return "is empty"
    if len(username) > MAX_USERNAME:
        return f"is longer than {MAX_USERNAME} characters"
    if ":" in username:
        return "holds ':', which the registry's basic auth cannot carry in a username"
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) < 0xE000 for c in username):
        return "holds a control character or a lone surrogate"
    return None


def password_problem(password: str) -> str | None:
    """Why `password` cannot be a registry password, or None. Says its size, never its text."""
    if not password:
        return "is empty"
    try:
        size = len(password.encode("utf-8"))
    except UnicodeEncodeError:
        return "holds a lone surrogate (such as \\ud800 in JSON), which is not text"
    if size > MAX_PASSWORD_BYTES:
        return f"is {size} bytes; a registry password holds at most {MAX_PASSWORD_BYTES}"
    if "\0" in password:
        return "holds a NUL character"
    return None


RegistryHost = Annotated[str, StringConstraints(pattern=REGISTRY_HOST_PATTERN, max_length=MAX_HOST)]
SealedPassword = Annotated[
    str, StringConstraints(pattern=SEALED_PATTERN, max_length=sealed_length(MAX_PASSWORD_BYTES))
]


class RegistryLogin(Model):
    """One registry's login (`registries/{host}`), read by the control plane alone: at deploy,
    to pull an image from `host`. The password is sealed bound to the host (a record copied
    under another host's key does not open)."""

    host: RegistryHost
    username: str
    password: SealedPassword
    set_at: float
    set_by: Name
    """The name of the token that set it (`admin` for the admin token)."""

    @field_validator("host")
    @classmethod
    def _host(cls, host: str) -> str:
        problem = registry_host_problem(host)
        if problem is not None:
            raise ValueError(f"the host {problem}")
        return host

    @field_validator("username")
    @classmethod
    def _username(cls, username: str) -> str:
        problem = username_problem(username)
        if problem is not None:
            raise ValueError(f"the username {problem}")
        return username

    @property
    def key_id(self) -> str:
        """The id of the key that opens the password."""
        return self.password.split(":", 2)[1]
