"""A listener on one loopback address holds the other one's port too; one on every IPv4
address holds every IPv6 address's.

A control-plane piece that listens on 127.0.0.1:P leaves [::1]:P free, and clients that
resolve `localhost` (or `app.localhost`) try ::1 first: a sandbox that binds [::1]:P would get
the requests meant for the ingress or the control API. Likewise one on 0.0.0.0:P leaves [::]:P
(and [::1]:P) to whoever binds it first, and IPv6 clients of the machine's names with it.
`hold_loopback_twin` binds the twin address without listening, so nobody else can take it and
a client trying it is refused at once (then falls back to the address we serve on). The twin
closes when the listener is garbage collected, or at exit; a listener on the same port in this
process meanwhile shares it, and it closes when the last of them is collected.
"""

from __future__ import annotations

import errno
import logging
import socket
import weakref
from dataclasses import dataclass

log = logging.getLogger(__name__)

TWINS = {"127.0.0.1": "::1", "::1": "127.0.0.1", "0.0.0.0": "::"}


def hold_loopback_twin(listener: socket.socket) -> socket.socket | None:
    """Bind the other loopback address (or the IPv6 wildcard, for the IPv4 one) at
    `listener`'s port (the one this process holds already for another listener there: shared);
    None when there is none to hold (another address, no IPv6, or someone else holds it)."""
    host, port = listener.getsockname()[:2]
    twin_host = TWINS.get(host)
    if twin_host is None:
        return None
    held = _HELD.get((twin_host, port))
    if held is not None:  # held for earlier listeners on this port, closed or not: shared
        held.listeners += 1
        weakref.finalize(listener, _release, held)
        return held.twin
    family = socket.AF_INET6 if ":" in twin_host else socket.AF_INET
    try:
        twin = socket.socket(family, socket.SOCK_STREAM)  # no IPv6 at all: nothing to hold
    except OSError:
        return None
    try:
        if family == socket.AF_INET6:
            twin.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        twin.bind((twin_host, port))
    except OSError as exc:
        twin.close()
        if exc.errno == errno.EADDRINUSE:  # taken before us: whoever holds it gets its clients
            log.warning(
                "listening on %s:%d, but [%s]:%d is bound by another socket: clients that "
                "try it reach that one, not this",
                host,
                port,
                twin_host,
                port,
            )
        return None
    held = _HELD[(twin_host, port)] = _Held(twin_host, port, twin)
    weakref.finalize(listener, _release, held)
    return twin


@dataclass
class _Held:
    """A twin this process holds, and how many listeners on its port are not yet collected.
    A listener closed and not yet collected still counts: a listener on the same port after
    it (a standby's control API, then the leader's) shares the twin, where binding it again
    failed and warned that "another socket" held it. The twin closes when the last goes."""

    host: str
    port: int
    twin: socket.socket
    listeners: int = 1


_HELD: dict[tuple[str, int], _Held] = {}


def _release(held: _Held) -> None:
    held.listeners -= 1
    if held.listeners == 0:
        held.twin.close()
        if _HELD.get((held.host, held.port)) is held:
            del _HELD[(held.host, held.port)]
