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
import struct

RANDOM_DRAWS = 16


class NoFreePort(RuntimeError):
    pass


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """A server could listen on it now. With SO_REUSEADDR, as servers bind: a connection of an
    earlier sandbox's still in TIME-WAIT there does not make the port unusable (a listener
    does, on Linux)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
        """A random free port of the range: a few random draws first (shuffling a range of
        10,000 ports cost every cold start ~2 ms), then every port in random order."""
        for _ in range(RANDOM_DRAWS):
            port = random.randint(self._low, self._high)
            if self._free(port):
                return self._hand_out(port)
        candidates = list(range(self._low, self._high + 1))
        random.shuffle(candidates)
        for port in candidates:
            if self._free(port):
                return self._hand_out(port)
        raise NoFreePort(f"no free port left in {self._low}-{self._high}")

    def _free(self, port: int) -> bool:
        return port not in self._taken and bindable(port, self._host)

    def _hand_out(self, port: int) -> int:
        self._taken.add(port)
        return port

    def give_back(self, port: int) -> None:
        self._taken.discard(port)

    def handed_out(self, port: int) -> bool:
        """Given to a sandbox of this node (a fixed `port` must not take it from that one)."""
        return port in self._taken

    def check_fixed(self, port: int) -> int:
        """`port`, an app's fixed one (`wakeful.toml` `port`), if a sandbox may listen on it
        now (it is not handed out from the pool, nor taken); `NoFreePort` saying why not."""
        if self.handed_out(port):
            raise NoFreePort(f"port {port} is handed out to another sandbox here")
        if not bindable(port, self._host):
            raise NoFreePort(f"port {port} is already in use")
        return port


def listeners(port: int) -> list[int]:
    """The uids owning TCP sockets that listen on `port`, on any address, in this network
    namespace. Asked of the kernel's socket-diagnostics netlink (what `ss` uses), which walks
    only the listening sockets: ~0.1 ms. /proc/net/tcp, the fallback where netlink is refused,
    walks the whole connection hash table: ~10 ms here, on every sandbox's way to ready."""
    try:
        return [uid for family in (socket.AF_INET, socket.AF_INET6) for uid in _diag(family, port)]
    except OSError:
        return listeners_from_proc(port)


NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 0x1, 0x300, 2, 3
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2, its inet_diag_sockid left zero
_SPORT, _UID = 4, 64  # offsets in inet_diag_msg: id.idiag_sport (big-endian), idiag_uid


def _diag(family: int, port: int) -> list[int]:
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    header = _HEADER.pack(
        _HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
    )
    owners: list[int] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(2)
        sock.sendto(header + request, (0, 0))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise OSError("sock_diag closed before it was done")
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if kind == NLMSG_DONE:
                    return owners
                if kind == NLMSG_ERROR or length < _HEADER.size:
                    raise OSError("sock_diag refused the request")
                body = offset + _HEADER.size
                if struct.unpack_from("!H", data, body + _SPORT)[0] == port:
                    owners.append(struct.unpack_from("=I", data, body + _UID)[0])
                offset += (length + 3) & ~3


def listeners_from_proc(port: int) -> list[int]:
    owners: list[int] = []
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
