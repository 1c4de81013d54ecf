"""A listener on one loopback address holds the other one's port too; one on every IPv4
address holds every IPv6 address's.

A control-plane piece that listens on 127.0.0.1:P leaves [::1]:P free, and clients that
resolve `localhost` (or `app.localhost`) try ::1 first: a sandbox that binds [::1]:P would get
the requests meant for the ingress or the control API. Likewise one on 0.0.0.0:P leaves [::]:P
(and [::1]:P) to whoever binds it first, and IPv6 clients of the machine's names with it.
`hold_loopback_twin` binds the twin address without listening, so nobody else can take it and
a client trying it is refused at once (then falls back to the address we serve on). The twin
closes when the listener is garbage collected, or at exit; a later listener on the same port
in this process takes it over.
"""

from __future__ import annotations

import errno
import logging
import socket
import weakref

log = logging.getLogger(__name__)

TWINS = {"127.0.0.1": "::1", "::1": "127.0.0.1", "0.0.0.0": "::"}


def hold_loopback_twin(listener: socket.socket) -> socket.socket | None:
    """Bind the other loopback address (or the IPv6 wildcard, for the IPv4 one) at
    `listener`'s port; None when there is none to hold (another address, no IPv6, or someone
    holds it already)."""
    host, port = listener.getsockname()[:2]
    twin_host = TWINS.get(host)
    if twin_host is None:
        return None
    held = _HELD.get((twin_host, port))
    if held is not None:  # held for an earlier listener on this port
        earlier = held[0].peek()
        if earlier is not None and earlier[0].fileno() != -1:
            return None  # which is open (SO_REUSEPORT): it holds the twin for both
        if held[0].detach() is not None:  # closed, not yet collected: its twin is taken over
            _hold(listener, twin_host, port, held[1])
            return held[1]
        _HELD.pop((twin_host, port), None)
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
    _hold(listener, twin_host, port, twin)
    return twin


_HELD: dict[tuple[str, int], tuple[weakref.finalize[..., socket.socket], socket.socket]] = {}
"""The twins this process holds, by address, each with what closes it once its listener is
collected. A listener closed and not yet collected still holds its twin: a listener on the
same port after it (a standby's control API, then the leader's) takes that twin over, where
binding it again failed and warned that "another socket" held it."""


def _hold(listener: socket.socket, host: str, port: int, twin: socket.socket) -> None:
    _HELD[(host, port)] = (weakref.finalize(listener, _release, host, port, twin), twin)


def _release(host: str, port: int, twin: socket.socket) -> None:
    twin.close()
    if _HELD.get((host, port), (None, None))[1] is twin:
        del _HELD[(host, port)]
