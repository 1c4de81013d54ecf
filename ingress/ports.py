"""The ingress's listening sockets (`bind_listener`), and the client ports `ingress.workers`
keeps for its workers: bound with SO_REUSEPORT, not listening, refused to anyone else
(`reserve`); a port held only by closing connections waited for (`reserved`)."""

from __future__ import annotations

import errno
import logging
import socket

import anyio

from wakeful.aio.loopback import hold_loopback_twin
from wakeful.ingress.settings import join_address, split_address

log = logging.getLogger(__name__)


def bind_listener(address: str, backlog: int, what: str, shared: bool = False) -> socket.socket:
    """Bind, or fail with an OSError that names the address (`what` says which one).
    `shared`: with SO_REUSEPORT, beside the other workers and their supervisor's placeholder
    (`ingress.workers`); the kernel spreads new connections across the listening ones."""
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio's loop sets TCP_NODELAY on an accepted socket only when its
    # listener says TCP (uvloop always does); the ingress sets none itself (test_nodelay.py).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, exc.strerror, f"{what} {address}") from exc
    if not shared:  # a worker's twin is held by its supervisor (`ports.reserve`)
        hold_loopback_twin(sock)  # no sandbox may answer on the other loopback for us
    return sock


def reserve(address: str, what: str) -> socket.socket:
    """`address` bound with SO_REUSEPORT and not listening: the port is kept for the workers.
    Without SO_REUSEADDR: another user could otherwise bind it with SO_REUSEADDR and listen
    while no worker does (the kernel refuses SO_REUSEPORT across users, so no sandbox joins
    the group). A port someone already listens on, even with SO_REUSEPORT (a second
    supervisor, leftover workers), is refused as taken."""
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if port:
            _not_listened_on(family, host, port)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, exc.strerror, f"{what} {address}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE and port:  # nobody listens: connections closing
            why = "held by connections still closing (TIME_WAIT), or a socket not listening"
            raise Closing(exc.errno, why, f"{what} {address}") from exc
        raise OSError(exc.errno, exc.strerror, f"{what} {address}") from exc
    hold_loopback_twin(sock)
    return sock


class Closing(OSError):
    """A port no socket listens on, held by connections closing (TIME_WAIT) that a socket
    without SO_REUSEPORT accepted: the kernel refuses the port to a SO_REUSEPORT bind until
    they are gone, at most a minute."""


CLOSING_WAIT = 65.0
"""Seconds `reserved` waits for a port's closing connections (TIME_WAIT lasts 60 s)."""


async def reserved(address: str, what: str, wait: float = CLOSING_WAIT) -> socket.socket:
    """`reserve`, waiting (at most `wait` seconds) while the port is `Closing`: switching
    an ingress that ran alone to workers, and starting it at once, would otherwise fail."""
    deadline = anyio.current_time() + wait
    told = False
    while True:
        try:
            return reserve(address, what)
        except Closing as exc:
            if anyio.current_time() >= deadline:
                raise
            if not told:
                told = True
                log.warning("%s: waiting for it (at most %.0f s)", exc, wait)
            await anyio.sleep(1)


def _not_listened_on(family: socket.AddressFamily, host: str, port: int) -> None:
    """EADDRINUSE when a socket listens on host:port (with or without SO_REUSEPORT); a
    port held only by connections closing (TIME_WAIT) is free (SO_REUSEADDR)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return join_address(host, port)
