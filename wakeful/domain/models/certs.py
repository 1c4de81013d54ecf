"""Certificates the control plane gets from an ACME server for the apps' hosts, and what the
ingresses need to answer its HTTP-01 challenges. Written by the leading activator alone
(`wakeful.certs`); every private key sealed under the secrets' keys, bound to its name.

| key                       | model          | who reads it                           |
|---------------------------|----------------|----------------------------------------|
| `certs/{name}`            | CertRecord     | the control plane, every ingress       |
| `acme/keys/{name}`        | CertKey        | the control plane alone (sealed)       |
| `acme/account`            | AcmeAccount    | the control plane alone (sealed)       |
| `acme/challenges/{token}` | AcmeChallenge  | the control plane, every ingress       |

A certificate's key is a record of its own, apart from the certificate, so that an ingress,
which follows `certs/` to learn when to fetch, never reads a sealed record (etcd's roles:
`wakeful.store.etcd_auth`).

A certificate record exists for each name the control plane orders for, whatever its state:
`ordering` (no certificate yet), `valid`, `renewing` (a certificate still served while a new
one is ordered), `failing` (the last attempt failed: `last_error`, `next_attempt`; the
certificate it holds, if any, is served until it expires).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import StringConstraints

from .base import Host, Model, Name
from .secrets import SEALED_PATTERN, sealed_length

MAX_KEY_PEM = 16 * 1024
"""An RSA 4096 or EC private key in PEM, with room."""
MAX_CHAIN_PEM = 64 * 1024
"""A leaf and its intermediates."""
TOKEN_PATTERN = r"^[A-Za-z0-9_-]{16,128}$"
"""An ACME challenge token: base64url, at least 128 bits (RFC 8555 §8.3)."""

ACCOUNT_PURPOSE = "acme account"
"""What the account's key is sealed bound to (`KeyRing.seal_for`)."""


def cert_key_purpose(name: str) -> str:
    """What a certificate's key for `name` is sealed bound to."""
    return f"acme certificate {name}"


SealedKey = Annotated[
    str, StringConstraints(pattern=SEALED_PATTERN, max_length=sealed_length(MAX_KEY_PEM))
]
ChallengeToken = Annotated[str, StringConstraints(pattern=TOKEN_PATTERN)]


class CertState(StrEnum):
    ORDERING = "ordering"
    VALID = "valid"
    RENEWING = "renewing"
    FAILING = "failing"


class AcmeAccount(Model):
    """The ACME account the control plane orders with (`acme/account`): one per directory."""

    directory: str
    email: str
    uri: str
    """The account's URL at the ACME server."""
    key: SealedKey
    """Its private key (PEM), sealed bound to `acme account` (`ACCOUNT_PURPOSE`)."""

    @property
    def key_id(self) -> str:
        return self.key.split(":", 2)[1]


class Issued(Model):
    """A certificate as issued: its chain in PEM (its key is in `CertKey`)."""

    chain: Annotated[str, StringConstraints(max_length=MAX_CHAIN_PEM)]
    not_before: float
    not_after: float
    issuer: str
    serial: str
    """In hex: what tells one issued certificate from the next."""
    directory: str = ""
    """The ACME directory that issued it: one from another (staging, before production) is
    replaced at once."""


class CertKey(Model):
    """The private key of a name's certificate (`acme/keys/{name}`), written with it."""

    name: Host
    serial: str
    """The certificate's it belongs to."""
    key: SealedKey
    """The private key (PEM), sealed bound to `acme certificate {name}`."""

    @property
    def key_id(self) -> str:
        return self.key.split(":", 2)[1]


class CertRecord(Model):
    """One name's certificate and what the control plane is doing about it (`certs/{name}`)."""

    name: Host
    state: CertState
    app: Name | None = None
    """The app that routes the name (the first by name, if several claim it)."""
    issued: Issued | None = None
    failures: int = 0
    """Attempts failed in a row (0 after a success)."""
    last_error: str = ""
    next_attempt: float = 0.0
    """When an order may start again (wall clock): 0 for as soon as it is due."""
    updated_at: float = 0.0


class AcmeChallenge(Model):
    """An HTTP-01 challenge the ingresses answer (`acme/challenges/{token}`) while an order
    waits for its validation: `GET /.well-known/acme-challenge/{token}` on every replica's
    plain listener gets `key_authorization`."""

    token: ChallengeToken
    key_authorization: Annotated[str, StringConstraints(max_length=256)]
    name: Host
