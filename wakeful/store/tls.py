"""etcd over TLS: which files the `WAKEFUL_ETCD_*` settings name, checked before any
connection, and whether a plaintext (or server-only TLS) etcd deserves a warning.

Everything here is decided without the network: `load_tls` reads and sniffs the PEM files,
`exposure_warning` and `connect_hint` are pure. See docs/design/etcd-tls.md.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import TLSConfigError

CA, CERT, KEY, SERVER_NAME = (
    "WAKEFUL_ETCD_CA",
    "WAKEFUL_ETCD_CERT",
    "WAKEFUL_ETCD_KEY",
    "WAKEFUL_ETCD_SERVER_NAME",
)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for etcd over TLS: `ca` alone for server TLS, with `cert`+`key` for mTLS.
    `server_name` is the name checked in the server certificate instead of the address: grpc
    needs one when the URL lists several endpoints."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    @property
    def client_certificate(self) -> bool:
        return self.cert is not None and self.key is not None


@dataclass(frozen=True)
class TLSBytes:
    """What the etcd client takes: the PEM bytes of `TLSFiles`, all None for plaintext."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None


# What each file must hold, as the PEM header to look for and a word for the error.
_PEM = {
    CA: (b"-----BEGIN CERTIFICATE-----", "a PEM certificate (the CA's)"),
    CERT: (b"-----BEGIN CERTIFICATE-----", "a PEM certificate (the client's)"),
    KEY: (b"PRIVATE KEY-----", "a PEM private key"),
}


def _read(setting: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TLSConfigError(f"{setting}: {path} does not exist") from None
    except OSError as exc:
        raise TLSConfigError(f"{setting}: {path} cannot be read: {exc.strerror}") from None
    marker, what = _PEM[setting]
    if marker not in data:
        raise TLSConfigError(f"{setting}: {path} does not hold {what}")
    return data


def check_tls(tls: TLSFiles, endpoints: Sequence[str]) -> None:
    """Refuse a combination the etcd client cannot use, naming the settings."""
    if (tls.cert is None) != (tls.key is None):
        given, missing = (CERT, KEY) if tls.key is None else (KEY, CERT)
        raise TLSConfigError(
            f"{given} is set but {missing} is not: a client certificate needs both "
            f"{CERT} (the certificate) and {KEY} (its private key)"
        )
    if tls.ca is None and tls.cert is not None:
        raise TLSConfigError(
            f"{CERT} and {KEY} are set but {CA} is not: set {CA} to the CA certificate that "
            "signed etcd's server certificate"
        )
    if tls.ca is None and tls.server_name is not None:
        raise TLSConfigError(f"{SERVER_NAME} is set but {CA} is not: it only applies to TLS")
    if tls.ca is not None and len(endpoints) > 1 and tls.server_name is None:
        raise TLSConfigError(
            f"etcd over TLS with several endpoints ({', '.join(endpoints)}) needs "
            f"{SERVER_NAME}: a DNS name that every etcd server certificate lists in its "
            "subjectAltName, checked instead of the address"
        )


def load_tls(tls: TLSFiles, endpoints: Sequence[str]) -> TLSBytes:
    """The PEM bytes of `tls`, or `TLSConfigError` naming the setting and the file."""
    check_tls(tls, endpoints)
    return TLSBytes(
        ca=None if tls.ca is None else _read(CA, tls.ca),
        cert=None if tls.cert is None else _read(CERT, tls.cert),
        key=None if tls.key is None else _read(KEY, tls.key),
        server_name=tls.server_name,
    )


def _host(endpoint: str) -> str:
    host = endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
    return host.removeprefix("[").removesuffix("]")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z) and the name `localhost`."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # another name: it may resolve anywhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def exposure_warning(endpoints: Sequence[str], tls: TLSFiles) -> str | None:
    """The warning to log when etcd is reached off this machine without a client
    certificate, or None. etcd holds every app's command: whoever can write to it runs code
    on every node."""
    if tls.client_certificate:
        return None
    exposed = [endpoint for endpoint in endpoints if not is_loopback(_host(endpoint))]
    if not exposed:
        return None
    return (
        f"etcd without a client certificate: anyone who can reach etcd at "
        f"{', '.join(exposed)} can rewrite an app's command; use mutual TLS "
        f"({CA}/CERT/KEY)"
    )


def connect_hint(tls: TLSFiles) -> str:
    """What to check, given the TLS configured, when etcd does not answer the first call: a
    refused handshake looks like an unreachable etcd."""
    if tls.ca is None:
        return (
            f"if etcd is up there and serves TLS (https:// client URLs), set {CA}, and "
            f"{CERT} and {KEY} when it requires client certificates"
        )
    if not tls.client_certificate:
        return (
            f"if etcd is up there and requires client certificates (--client-cert-auth), set "
            f"{CERT} and {KEY}; check that {CA} signed etcd's server certificate"
        )
    return (
        f"if etcd is up there, check that {CA} signed etcd's server certificate (whose "
        f"subjectAltName must list the address, or {SERVER_NAME}) and that etcd's "
        f"--trusted-ca-file signed {CERT}"
    )
