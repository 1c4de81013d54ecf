"""TLS on the ingress: certificates by host from one directory, chosen by SNI, reloaded when the
files change, without a restart.

The directory (`tls_dir`) holds PEM pairs named by the host they serve: `HOST.crt` (the
certificate, then its chain) and `HOST.key`. `HOST` is an exact name (`shop.example.com`) or a
wildcard one label deep (`*.example.com.crt` serves `a.example.com`, not `a.b.example.com`, nor
`example.com`). `default.crt` / `default.key` are required: they serve a client that sends no
name, or one no other pair covers. A client is offered TLS 1.2 or newer and HTTP/1.1 (ALPN).

`Certificates.reload` reads the directory again when a file in it changed (name, size, mtime):
every pair is loaded into a new table first, and only a whole, valid table replaces the one in
use, so a half-copied key or a mismatched pair is logged and changes nothing. Connections
already open keep the certificate they were made with; new ones get the new table. `watch`
calls it every `interval` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
DEFAULT = "default"


class TLSConfigError(ValueError):
    """The directory cannot serve TLS: no default pair, or a pair that does not load."""


@dataclass(frozen=True)
class _Table:
    exact: dict[str, ssl.SSLContext]
    wildcard: dict[str, ssl.SSLContext]
    """By the part after `*.`."""
    default: ssl.SSLContext

    def choose(self, name: str | None) -> ssl.SSLContext:
        if not name:
            return self.default
        name = name.lower().rstrip(".")
        found = self.exact.get(name)
        if found is None and "." in name:
            found = self.wildcard.get(name.split(".", 1)[1])
        return found or self.default


def _context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"{cert.name} with {key.name}: {exc}") from exc
    return context


def _read(directory: Path) -> _Table:
    exact: dict[str, ssl.SSLContext] = {}
    wildcard: dict[str, ssl.SSLContext] = {}
    default: ssl.SSLContext | None = None
    try:
        certs = sorted(directory.glob("*.crt"))
    except OSError as exc:
        raise TLSConfigError(f"cannot read {directory}: {exc}") from exc
    for cert in certs:
        host = cert.name.removesuffix(".crt").lower()
        key = cert.with_suffix(".key")
        if not key.exists():
            raise TLSConfigError(f"{cert.name} has no {key.name} beside it in {directory}")
        context = _context(cert, key)
        if host == DEFAULT:
            default = context
        elif host.startswith("*."):
            wildcard[host[2:]] = context
        else:
            exact[host] = context
    if default is None:
        raise TLSConfigError(
            f"{directory} has no default.crt and default.key: they serve clients that send no "
            "name, or one no other certificate covers"
        )
    return _Table(exact, wildcard, default)


def _signature(directory: Path) -> tuple[tuple[str, int, int], ...]:
    found = []
    try:
        for entry in os.scandir(directory):
            if entry.name.endswith((".crt", ".key")):
                stat = entry.stat()
                found.append((entry.name, stat.st_size, stat.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(found))


class Certificates:
    def __init__(self, directory: Path) -> None:
        """Loads the directory now: raises `TLSConfigError` when it cannot serve."""
        self.directory = directory
        self._signature = _signature(directory)
        self._table = _read(directory)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        """What the listener is given: a front whose SNI callback hands each connection the
        context of the table in use at that moment (so a reload needs no new listener)."""
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_alpn_protocols(["http/1.1"])
        self.context.sni_callback = self._choose
        self._load_front()

    def _load_front(self) -> None:
        # The front needs a certificate of its own for OpenSSL to start a handshake; the SNI
        # callback replaces it for every connection.
        cert, key = self.directory / f"{DEFAULT}.crt", self.directory / f"{DEFAULT}.key"
        try:
            self.context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"{cert.name} with {key.name}: {exc}") from exc

    def _choose(
        self, connection: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext
    ) -> None:
        connection.context = self._table.choose(name)

    def hosts(self) -> list[str]:
        table = self._table
        return sorted([*table.exact, *(f"*.{suffix}" for suffix in table.wildcard)])

    def reload(self) -> bool:
        """Use the directory's pairs as they are now, if any file changed and all of them load;
        True when a new table is in use."""
        signature = _signature(self.directory)
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            table = _read(self.directory)
        except TLSConfigError as exc:
            log.error("TLS certificates not reloaded, the ones in use stay: %s", exc)
            return False
        self._table = table
        log.info("TLS certificates reloaded: %s and the default", ", ".join(self.hosts()) or "-")
        return True

    async def watch(self, interval: float) -> None:
        """Reload every `interval` seconds until cancelled, off the event loop (the stat calls,
        and reading and checking the pairs when something changed); the table in use is
        swapped in one assignment, which the SNI callback on the loop reads."""
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.reload)
