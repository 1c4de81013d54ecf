"""One ACME conversation, through certbot's `acme` package: synchronous (requests), so every
call here runs in a worker thread (`anyio.to_thread`), never on the event loop.

An order answers HTTP-01 only. TLS-ALPN-01 would need the TLS listener to pick a certificate
by the client's ALPN list, and Python's `ssl` decides the certificate in the SNI callback,
before it has seen that list: the only way would be a second TLS stack. HTTP-01 needs port
80 reaching an ingress's plain listener, which serving HTTP needs anyway.

`publish` and `withdraw` are called from the worker thread: they put a challenge where every
ingress answers it (the store) and take it away; the order waits for both.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from acme import challenges, client, crypto_util, errors, messages
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from josepy.jwk import JWKRSA

USER_AGENT = "wakeful"


class AcmeFailure(Exception):
    """An order or a registration did not succeed; the message says why, for `wakeful certs`.
    `account_gone`: the CA no longer knows the account (a new one must be made)."""

    def __init__(self, message: str, *, account_gone: bool = False) -> None:
        super().__init__(message)
        self.account_gone = account_gone


ACCOUNT_GONE = "accountDoesNotExist"
"""The ACME error code of an account the CA does not know (RFC 8555 §6.7)."""


def _account_gone(exc: BaseException) -> bool:
    return isinstance(exc, messages.Error) and exc.code == ACCOUNT_GONE


@dataclass(frozen=True)
class Account:
    key_pem: str
    uri: str


@dataclass(frozen=True)
class Certificate:
    chain: str
    key_pem: str
    not_before: float
    not_after: float
    issuer: str
    serial: str


def new_key_pem(kind: str = "ec") -> str:
    """A private key in PEM: P-256 for a certificate (`ec`), RSA 2048 for an account."""
    key = (
        ec.generate_private_key(ec.SECP256R1())
        if kind == "ec"
        else rsa.generate_private_key(65537, 2048)
    )
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def describe(chain: str) -> tuple[float, float, str, str]:
    """(not before, not after, issuer, serial in hex) of the chain's first certificate."""
    leaf = x509.load_pem_x509_certificate(chain.encode())
    return (
        leaf.not_valid_before_utc.timestamp(),
        leaf.not_valid_after_utc.timestamp(),
        leaf.issuer.rfc4514_string(),
        format(leaf.serial_number, "x"),
    )


class Conversation:
    """An ACME client for one directory and account key: `register`, then `order`."""

    def __init__(self, directory: str, account_key_pem: str, *, ca: str | None) -> None:
        """`ca`: a PEM bundle to trust the directory's TLS with (a private ACME server)."""
        key = serialization.load_pem_private_key(account_key_pem.encode(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise AcmeFailure("the ACME account key is not an RSA key")
        self._key = JWKRSA(key=key)
        # requests takes a CA bundle's path where acme's annotation says bool.
        verify = cast(bool, ca if ca is not None else True)
        self._net = client.ClientNetwork(self._key, user_agent=USER_AGENT, verify_ssl=verify)
        try:
            self._client = client.ClientV2(
                client.ClientV2.get_directory(directory, self._net), net=self._net
            )
        except Exception as exc:  # requests' and acme's own: the directory is not reachable
            raise AcmeFailure(f"cannot read the ACME directory {directory}: {exc}") from exc

    def register(self, email: str, uri: str | None) -> str:
        """The account's URL: `uri` when the CA still knows it, else a new account (or the one
        this key has)."""
        if uri:
            known = messages.RegistrationResource(uri=uri, body=messages.Registration())
            self._net.account = known
            try:
                self._client.query_registration(known)
                return uri
            except Exception as exc:
                if not _account_gone(exc):
                    text = f"the ACME server did not answer for the account: {exc}"
                    raise AcmeFailure(text) from exc
                self._net.account = None  # the CA forgot it (reset, or deactivated): anew
        registration = messages.NewRegistration.from_data(email=email, terms_of_service_agreed=True)
        try:
            made = self._client.new_account(registration)
        except errors.ConflictError as exc:  # this key has an account already
            self._net.account = messages.RegistrationResource(
                uri=exc.location, body=messages.Registration()
            )
            return str(exc.location)
        except Exception as exc:
            raise AcmeFailure(f"the ACME server refused a new account: {exc}") from exc
        return str(made.uri)

    def order(
        self,
        name: str,
        *,
        publish: Callable[[str, str], None],
        withdraw: Callable[[str], None],
        timeout: float,
    ) -> Certificate:
        """A certificate for `name`, its HTTP-01 challenges published while they are checked."""
        key_pem = new_key_pem("ec")
        csr = crypto_util.make_csr(key_pem.encode(), [name])
        published: list[str] = []
        try:
            order = self._client.new_order(csr)
            for authz in order.authorizations:
                if authz.body.status == messages.STATUS_VALID:
                    continue  # validated before (by this account): nothing to answer
                challenge = next(
                    (c for c in authz.body.challenges if isinstance(c.chall, challenges.HTTP01)),
                    None,
                )
                if challenge is None:
                    raise AcmeFailure(f"the ACME server offers no HTTP-01 challenge for {name}")
                response, validation = challenge.response_and_validation(self._key)
                token = challenge.chall.encode("token")
                publish(token, validation)
                published.append(token)
                self._client.answer_challenge(challenge, response)
            deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
            done = self._client.poll_and_finalize(order, deadline=deadline)
        except AcmeFailure:
            raise
        except errors.ValidationError as exc:
            raise AcmeFailure(f"validation failed for {name}: {_problems(exc)}") from exc
        except errors.TimeoutError as exc:
            raise AcmeFailure(f"the order for {name} took longer than {timeout:g} s") from exc
        except Exception as exc:  # a refusal (rate limit, policy), the network
            gone = _account_gone(exc)
            raise AcmeFailure(f"the order for {name} failed: {exc}", account_gone=gone) from exc
        finally:
            for token in published:
                withdraw(token)
        chain = done.fullchain_pem
        not_before, not_after, issuer, serial = describe(chain)
        return Certificate(chain, key_pem, not_before, not_after, issuer, serial)


def _problems(exc: errors.ValidationError) -> str:
    found = []
    for authz in exc.failed_authzrs:
        for challenge in authz.body.challenges:
            if challenge.error is not None:
                found.append(str(challenge.error))
    return "; ".join(found) or str(exc)
