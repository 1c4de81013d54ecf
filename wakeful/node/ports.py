"""Ports for sandboxes, picked so that nothing else is likely to take them before the app binds.

A port from the kernel's "free port" trick lies in the ephemeral range, where every outgoing
connection on the machine also draws its source port: between our pick and the app's bind
(seconds, when many apps boot at once) one of them can take it, and the app dies with
"address in use". Sandbox ports therefore come from a range below the ephemeral one, are never
handed to two live sandboxes, and are checked free at the moment they are picked.
"""

from __future__ import annotations

import random
import socket


class NoFreePort(RuntimeError):
    pass


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortPool:
    def __init__(self, low: int, high: int, host: str = "127.0.0.1") -> None:
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"port range {low}-{high} must lie within 1024-65535")
        self._low, self._high = low, high
        self._taken: set[int] = set()
        self._host = host

    def take(self) -> int:
        candidates = list(range(self._low, self._high + 1))
        random.shuffle(candidates)
        for port in candidates:
            if port not in self._taken and bindable(port, self._host):
                self._taken.add(port)
                return port
        raise NoFreePort(f"no free port left in {self._low}-{self._high}")

    def give_back(self, port: int) -> None:
        self._taken.discard(port)

    def handed_out(self, port: int) -> bool:
        """Given to a sandbox of this node (a fixed `port` must not take it from that one)."""
        return port in self._taken


def listeners(port: int) -> list[int]:
    """The uids owning TCP sockets that listen on `port`, on any address (Linux /proc/net)."""
    owners = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    local, state, uid = fields[1], fields[3], fields[7]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        owners.append(int(uid))
        except OSError:
            continue
    return owners
