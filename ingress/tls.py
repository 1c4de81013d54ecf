"""TLS on the ingress: certificates by host from one directory and from ACME (`ingress.acme`),
chosen by SNI, replaced without a restart.

The directory (`tls_dir`) holds PEM pairs named by the host they serve: `HOST.crt` (the
certificate, then its chain) and `HOST.key`. `HOST` is an exact name (`shop.example.com`) or a
wildcard one label deep (`*.example.com.crt` serves `a.example.com`, not `a.b.example.com`, nor
`example.com`). `default.crt` / `default.key` are required: they serve a client that sends no
name, or one no other pair covers. A client is offered TLS 1.2 or newer and HTTP/1.1 (ALPN).

Certificates from ACME (`install_issued`) are kept in memory only (loaded through a memfd, never
a file on disk). A name's file certificate wins over its ACME one; the default pair serves a
name neither covers. With ACME and no directory there is no default: a handshake for a name
with no certificate (yet) fails with the `unrecognized_name` alert, and nothing else happens
(no order: `wakeful.certs` orders only for the apps' names).

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
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

log = logging.getLogger(__name__)
DEFAULT = "default"


class TLSConfigError(ValueError):
    """The directory cannot serve TLS: no default pair, or a pair that does not load."""


@dataclass(frozen=True)
class _Table:
    exact: dict[str, ssl.SSLContext]
    wildcard: dict[str, ssl.SSLContext]
    """By the part after `*.`."""
    default: ssl.SSLContext | None

    def choose(self, name: str, issued: dict[str, ssl.SSLContext]) -> ssl.SSLContext | None:
        """`name` lowercased without its trailing dot ('' for none); `issued`: ACME's."""
        if not name:
            return self.default
        found = self.exact.get(name)
        if found is None and "." in name:
            found = self.wildcard.get(name.split(".", 1)[1])
        return found or issued.get(name) or self.default


EMPTY = _Table({}, {}, None)


HTTP1 = ("http/1.1",)
HTTP2 = ("h2", "http/1.1")
"""What ALPN offers: a listener serving HTTP/2 too offers `h2` first (`ingress.http2`). Every
context offers the same: the SNI callback swaps the context before ALPN is chosen."""


TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""TLS 1.2's suites: forward secret AEAD only (Mozilla's "intermediate", less DHE), so none of
RFC 9113 Appendix A's, which an h2 connection must not use (OpenSSL's default let a client
that offered only CBC suites have one, with h2). TLS 1.3's suites are all AEAD, unchanged."""


def _server_context(alpn: tuple[str, ...]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.set_alpn_protocols(list(alpn))
    return context


MAX_PEM = 1024 * 1024
"""The largest certificate (with its chain) or key file loaded: a real one is a few KB."""


def _no_password() -> bytes:
    raise TLSConfigError("the key is encrypted: the ingress has no passphrase for it")


def _check_file(path: Path) -> None:
    """A file OpenSSL may read without blocking: a regular one (a link to one counts), not
    too large. A FIFO (or a device) hung the reload's thread for good, and shutdown with it."""
    try:
        info = path.stat()
    except OSError as exc:
        raise TLSConfigError(f"{path.name}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise TLSConfigError(f"{path.name} is not a regular file")
    if info.st_size > MAX_PEM:
        raise TLSConfigError(f"{path.name} is {info.st_size} bytes, more than {MAX_PEM}")


def _load_pair(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """`context` serves the pair in `cert` and `key`; TLSConfigError when it cannot."""
    _check_file(cert)
    _check_file(key)
    try:  # an encrypted key would have OpenSSL ask a terminal for its passphrase
        context.load_cert_chain(cert, key, password=_no_password)
    except TLSConfigError as exc:
        raise TLSConfigError(f"{key.name}: {exc}") from None
    except ssl.SSLError as exc:
        raise TLSConfigError(_refused_pair(cert, key, exc)) from exc
    except OSError as exc:
        raise TLSConfigError(f"{cert.name} with {key.name}: {exc}") from exc


def _refused_pair(cert: Path, key: Path, exc: ssl.SSLError) -> str:
    """Why OpenSSL refused a pair, naming the file: its own words for a file that is not PEM
    (`[SSL] PEM lib`) name neither. OpenSSL's words when the files cannot be read again as
    they were (changed meanwhile: each is checked again first) or say nothing more."""
    said = f"{cert.name} with {key.name}: {exc}"
    try:
        _check_file(cert)
        _check_file(key)
        chain, private_pem = cert.read_bytes(), key.read_bytes()
    except (TLSConfigError, OSError):
        return said
    try:
        leaf = x509.load_pem_x509_certificates(chain)[0]
    except ValueError:
        return f"{cert.name} holds no PEM certificate, or one that does not parse"
    try:
        private = serialization.load_pem_private_key(private_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return f"{key.name} is not a PEM private key (-----BEGIN PRIVATE KEY----- ...)"
    try:
        if _public(private.public_key()) != _public(leaf.public_key()):
            return f"{key.name} is not the key of the certificate in {cert.name} (the first one)"
    except (ValueError, UnsupportedAlgorithm):
        return said
    return said


def _public(key: Any) -> bytes:
    return bytes(
        key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _context(cert: Path, key: Path, alpn: tuple[str, ...]) -> ssl.SSLContext:
    context = _server_context(alpn)
    _load_pair(context, cert, key)
    return context


def _read(directory: Path, alpn: tuple[str, ...]) -> _Table:
    exact: dict[str, ssl.SSLContext] = {}
    wildcard: dict[str, ssl.SSLContext] = {}
    default: ssl.SSLContext | None = None
    if not directory.is_dir():
        missing = "is not a directory" if directory.exists() else "does not exist"
        raise TLSConfigError(f"the certificates' directory {directory} {missing}")
    try:
        certs = sorted(directory.glob("*.crt"))
    except OSError as exc:
        raise TLSConfigError(f"cannot read {directory}: {exc}") from exc
    for cert in certs:
        host = cert.name.removesuffix(".crt").lower()
        key = cert.with_suffix(".key")
        if not key.exists():
            raise TLSConfigError(f"{cert.name} has no {key.name} beside it in {directory}")
        context = _context(cert, key, alpn)
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


def quiet_undecodable_names() -> None:
    """A client hello whose server name is not ASCII never reaches the SNI callback: CPython
    fails to decode it, refuses the handshake (internal_error) and reports it through
    `sys.unraisablehook`, which prints a traceback per handshake by default, a log flood any
    client can cause. This process's hook drops that one case (a `UnicodeDecodeError` about
    a bytes object) and passes everything else on."""
    previous = sys.unraisablehook
    if getattr(previous, "wakeful_quiet_names", False):
        return

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is UnicodeDecodeError and isinstance(unraisable.object, bytes):
            log.debug("a TLS client sent a server name that is not ASCII: refused")
            return
        previous(unraisable)

    hook.wakeful_quiet_names = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def issued_context(chain: str, key: str, alpn: tuple[str, ...] = HTTP1) -> ssl.SSLContext:
    """A context serving `chain` with `key`, both PEM text, loaded from memory (a memfd: the
    key is never written to a disk). `TLSConfigError` when they do not load."""
    context = _server_context(alpn)
    fd = os.memfd_create("wakeful-certificate", os.MFD_CLOEXEC)
    try:
        os.write(fd, f"{chain.strip()}\n{key.strip()}\n".encode())
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"an issued certificate does not load: {exc}") from exc
    finally:
        os.close(fd)
    return context


def _load_issued(
    pairs: list[tuple[str, str, str, str]], alpn: tuple[str, ...]
) -> dict[str, tuple[str, ssl.SSLContext]]:
    """(serial, context) by name of each (name, chain, key, serial) that loads (blocking)."""
    loaded = {}
    for name, chain, key, serial in pairs:
        try:
            loaded[name] = (serial, issued_context(chain, key, alpn))
        except TLSConfigError as exc:
            log.error("certificate for %s not served: %s", name, exc)
    return loaded


class Certificates:
    def __init__(self, directory: Path | None, http2: bool = False) -> None:
        """Loads the directory now, if there is one: raises `TLSConfigError` when it cannot
        serve. `http2`: ALPN offers `h2` too."""
        self.directory = directory
        self._alpn = HTTP2 if http2 else HTTP1
        self._signature = () if directory is None else _signature(directory)
        self._table = EMPTY if directory is None else _read(directory, self._alpn)
        self._issued: dict[str, ssl.SSLContext] = {}
        """ACME's certificates by name (`install_issued`)."""
        self._loaded: dict[str, tuple[str, ssl.SSLContext]] = {}
        """The same, with the serial each was loaded for."""
        self.context = _server_context(self._alpn)
        """What the listener is given: a front whose SNI callback hands each connection the
        context of the table in use at that moment (so a reload needs no new listener)."""
        self.context.sni_callback = self._choose
        quiet_undecodable_names()
        if directory is not None:
            self._load_front(directory)

    def _load_front(self, directory: Path) -> None:
        # The front holds the default pair; the SNI callback replaces it for every connection.
        _load_pair(self.context, directory / f"{DEFAULT}.crt", directory / f"{DEFAULT}.key")

    def _choose(
        self, connection: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext
    ) -> int | None:
        found = self._table.choose((name or "").lower().rstrip("."), self._issued)
        if found is None:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        connection.context = found
        return None

    async def install_issued(self, pairs: list[tuple[str, str, str, str]]) -> None:
        """Serve these (name, chain, key, serial) from ACME from the next handshake on, in
        place of the ones before; a pair that does not load is logged and left out. Only a
        serial not loaded yet is loaded, in a worker thread (thousands of certificates take
        seconds); the table is swapped on the loop in one assignment."""
        loaded = dict(self._loaded)
        fresh = [pair for pair in pairs if loaded.get(pair[0], ("", None))[0] != pair[3]]
        made = await asyncio.to_thread(_load_issued, fresh, self._alpn)
        loaded.update(made)
        self._loaded = {name: loaded[name] for name, *_ in pairs if name in loaded}
        self._issued = {name: context for name, (_, context) in self._loaded.items()}
        log.info("certificates from ACME: %d, %d new", len(self._issued), len(made))

    def hosts(self) -> list[str]:
        table = self._table
        files = [*table.exact, *(f"*.{suffix}" for suffix in table.wildcard)]
        return sorted({*files, *self._issued})

    def reload(self) -> bool:
        """Use the directory's pairs as they are now, if any file changed and all of them load;
        True when a new table is in use."""
        if self.directory is None:
            return False
        signature = _signature(self.directory)
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            table = _read(self.directory, self._alpn)
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
