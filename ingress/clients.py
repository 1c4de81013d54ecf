"""Each client's share of the ingress: how many of its requests are under way at once.

The upstream connections are shared by every app and every client (`upstream_connections`,
1,024), and a request that waits for a slow app, or whose client reads its answer slowly,
holds one until it ends. Each app's own cap (`upstream_connections_per_app`) keeps one app
from taking them all, but not one client: over HTTP/2 a single connection carries 100
streams, so eleven connections that never read their answers held every slot for
`client_timeout`, and every other client of every app waited, then got 503.

So a client address has at most `requests_per_client` requests past routing at once (nginx's
`limit_conn`, which also counts each HTTP/2 stream). The next one is answered 429 with
`Retry-After` at once, without waiting: the client is the cause, and its queue would hold the
slots it is refused. An open WebSocket stops counting once it switched (it holds no upstream
slot then; `max_client_connections` bounds it).

Who a client is (`client_key`): its address; an IPv6 address by its /64, the block one host
is given (one address each would cost an attacker nothing). Behind a trusted load balancer
(`trust_forwarded`), the address the balancer forwarded for: the last `X-Forwarded-For`
entry, the one it wrote. Clients behind one NAT share a share: raise the bound for them.
The shares are a process's, as the upstream connections are: with N workers a client has N
(the kernel spreads its connections across them).
"""

from __future__ import annotations

import socket
from typing import Final

MAX_KEY: Final = 64
"""The longest key kept: an address's text is at most 45 characters (IPv6 with IPv4 in it)."""


def client_key(peer: str, forwarded_for: bytes | None = None) -> str:
    """Who a request counts for: `peer` (the connection's address), or the last entry of a
    trusted `X-Forwarded-For` when one is given (a port after it dropped: some balancers
    write `ADDRESS:PORT`, a new key for each connection). An IPv6 address by its /64
    network, an IPv4 one a dual-stack socket shows as IPv6 as itself; text that is no
    address as it is, cut to `MAX_KEY` characters. Through the C socket functions, not
    `ipaddress` (pure Python: 10-13 µs an IPv6 request, against 0.6-1 µs)."""
    if forwarded_for is not None:
        last = forwarded_for.rpartition(b",")[2].strip().decode("latin-1")
        if last[:1] == "[":  # [IPv6]:port
            last = last[1:].partition("]")[0]
        elif last.count(":") == 1:  # IPv4:port
            last = last.partition(":")[0]
        if last:
            peer = last
    if ":" not in peer:  # IPv4, or no address (a Unix socket): as it is
        return peer[:MAX_KEY]
    try:  # without a zone (`fe80::1%eth0`): each would be a key of its own
        packed = socket.inet_pton(socket.AF_INET6, peer.partition("%")[0])
    except OSError:
        return peer[:MAX_KEY]
    if packed[:12] == _MAPPED:
        return socket.inet_ntop(socket.AF_INET, packed[12:])
    return socket.inet_ntop(socket.AF_INET6, packed[:8] + _HOST_PART) + "/64"


_MAPPED: Final = bytes(10) + b"\xff\xff"
"""The first 12 bytes of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`)."""
_HOST_PART: Final = bytes(8)


class ClientShares:
    """Requests under way per client key, each at most `limit`."""

    __slots__ = ("_busy", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._busy: dict[str, int] = {}

    def take(self, key: str) -> bool:
        """Count one more request of `key`; False (nothing counted) when it has `limit`."""
        busy = self._busy.get(key, 0)
        if busy >= self.limit:
            return False
        self._busy[key] = busy + 1
        return True

    def give_back(self, key: str) -> None:
        busy = self._busy[key] - 1
        if busy:
            self._busy[key] = busy
        else:
            del self._busy[key]

    def busy(self, key: str) -> int:
        return self._busy.get(key, 0)

    def __len__(self) -> int:
        """Clients with a request under way."""
        return len(self._busy)
