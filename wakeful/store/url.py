"""Choosing and opening a store by URL: `memory://`, `sqlite:///path`, `etcd://h:p[,h:p]`."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import anyio

from .base import Store
from .errors import Unavailable
from .local import SHARED_LOOK, LocalStore
from .memory import MemoryEngine
from .sqlite import SqliteEngine
from .tls import TLSFiles, connect_hint, exposure_warning, load_tls

log = logging.getLogger(__name__)

__all__ = [
    "TLSFiles",
    "absolute_store_url",
    "etcd_endpoints",
    "open_store",
    "parse_store_url",
    "sqlite_url",
]


def parse_store_url(url: str) -> tuple[str, str]:
    """Split a store URL into (scheme, location), refusing anything we cannot open."""
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return "memory", ""
    if parts.scheme == "sqlite":
        # As elsewhere (SQLAlchemy): three slashes then a relative path, four for an
        # absolute one. `sqlite:///.wakeful/store.db` is `.wakeful/store.db`, not `/.wakeful`.
        path = parts.netloc + parts.path if parts.netloc else parts.path.removeprefix("/")
        if not path:
            raise ValueError(f"store URL {url!r}: sqlite needs a path, e.g. sqlite:///data/w.db")
        return "sqlite", path
    if parts.scheme == "etcd":
        endpoints = parts.netloc
        hosts = [h for h in endpoints.split(",") if h]
        if not hosts or any(":" not in h or not h.rsplit(":", 1)[1].isdigit() for h in hosts):
            raise ValueError(
                f"store URL {url!r}: etcd needs host:port[,host:port], e.g. etcd://127.0.0.1:2379"
            )
        return "etcd", ",".join(hosts)
    raise ValueError(f"store URL {url!r}: the scheme must be memory://, sqlite:// or etcd://")


def sqlite_url(path: Path) -> str:
    """The store URL of a SQLite file, absolute (resolved against the current directory)."""
    return f"sqlite:///{path.absolute()}"


def absolute_store_url(url: str) -> str:
    """`url` with a relative SQLite path resolved against the current directory, once, so a
    later change of directory cannot move the store. Other URLs are returned unchanged."""
    scheme, location = parse_store_url(url)
    return sqlite_url(Path(location)) if scheme == "sqlite" else url


def resolve_endpoints(endpoints: Sequence[str]) -> tuple[list[str], list[str]]:
    """`endpoints` (host:port) with every name replaced by its IPv4 addresses, and the names.

    etcd3aio dials one `ipv4:` target, which takes addresses only: `etcd://etcd:2379` (a
    compose service, a DNS name) failed with grpc's "the target uri is not valid". A name is
    resolved here, to all its addresses (the client balances over them); a name that
    resolves to none is `Unavailable`, naming it. `localhost` stays (etcd3aio maps it). A
    single endpoint that is a name is then dialed by name (`EtcdStore`'s `dns_name`), so grpc
    resolves it again when it moves; several are dialed at the addresses found here."""
    dialed: list[str] = []
    names: list[str] = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if host.startswith("["):
            raise Unavailable(
                f"etcd endpoint {endpoint!r}: an IPv6 address; the etcd client dials IPv4 "
                "only (give a name or an IPv4 address)"
            )
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            if host != "localhost":
                try:
                    found = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
                except (OSError, UnicodeError) as exc:
                    raise Unavailable(
                        f"etcd endpoint {endpoint!r}: {host!r} resolves to no IPv4 address ({exc})"
                    ) from exc
                addresses = sorted({str(info[4][0]) for info in found})
                dialed += [f"{address}:{port}" for address in addresses if address not in dialed]
                if host not in names:
                    names.append(host)
                continue
        dialed.append(endpoint)
    return dialed, names


def etcd_endpoints(url: str) -> list[str]:
    """The host:port endpoints of an `etcd://` URL."""
    scheme, location = parse_store_url(url)
    if scheme != "etcd":
        raise ValueError(f"store URL {url!r} is not an etcd:// URL")
    return location.split(",")


@contextlib.asynccontextmanager
async def open_store(
    url: str,
    *,
    namespace: str = "/wakeful/",
    tls: TLSFiles | None = None,
    clock: Callable[[], float] | None = None,
    shared: bool = True,
) -> AsyncIterator[Store]:
    """Open the store at `url` and run its housekeeping for as long as the block runs.

    `clock` (wall-clock seconds) decides when the embedded stores' TTL leases expire; tests
    pass one they move by hand. etcd keeps its own time and ignores it. `shared`: a SQLite
    file may be written by other processes too, so its watchers look for their writes
    (`SHARED_LOOK`); False for a process that knows it is the file's only user (a
    single-process `wakeful up`), which then never wakes to look."""
    scheme, location = parse_store_url(url)
    if scheme == "etcd":
        from .etcd import EtcdStore  # grpc is only imported when etcd is used

        tls = tls or TLSFiles()
        endpoints = location.split(",")
        pem = load_tls(tls, endpoints)  # TLSConfigError, naming the setting, before connecting
        warning = exposure_warning(endpoints, tls)
        if warning is not None:
            log.warning("%s", warning)
        dialed, names = await anyio.to_thread.run_sync(resolve_endpoints, endpoints)
        server_name = pem.server_name
        if server_name is None and pem.ca is not None and len(names) == 1:
            server_name = names[0]  # TLS checks the name it was given, not its address
        etcd = EtcdStore(
            dialed,
            namespace=namespace,
            ca_cert=pem.ca,
            cert_key=pem.key,
            cert_chain=pem.cert,
            tls_server_name=server_name,
            # One name (etcd://etcd:2379): grpc resolves it again when its addresses fail.
            dns_name=endpoints[0] if len(endpoints) == 1 and names else None,
        )
        try:
            try:
                await etcd.connect()
            except Unavailable as exc:  # a refused handshake looks like an unreachable etcd
                raise Unavailable(f"{exc}; {connect_hint(tls)}") from exc
            yield etcd
        finally:
            await etcd.aclose()  # also when connect() failed: the client holds a channel
        return
    engine = MemoryEngine() if scheme == "memory" else SqliteEngine(location)
    sqlite = scheme == "sqlite"
    local = LocalStore(
        engine,
        threaded=sqlite,
        clock=clock or time.time,
        shared=SHARED_LOOK if sqlite and shared else None,
        watch=Path(location) if sqlite and shared else None,
    )
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(local.run)
            try:
                yield local
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await local.aclose()
