"""How a connection to a sandbox ends: `shut` at the end of what it was for, `reset` at once.

A sandbox that stops reading must not keep anything of ours by it. What was written and not
read waits in two places: asyncio's write buffer and, behind it, the kernel's send queue (up
to the socket's send buffer, megabytes on loopback). A graceful close (a FIN) waits behind
both, for as long as the sandbox does not read: the descriptor while asyncio holds bytes, a
kernel orphan (FIN_WAIT1) after. So a connection with bytes unsent in either is reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import sys
from typing import Final

_LINGER_NONE: Final = struct.pack("ii", 1, 0)
"""SO_LINGER on, for 0 s: a close resets the connection."""
_SIOCOUTNSQ: Final = 0x894B
"""Linux's ioctl for the bytes in a socket's send queue not sent yet (linux/sockios.h): held
back by the peer's window, a peer that does not read."""


def shut(transport: asyncio.Transport) -> None:
    """Close a connection to a sandbox at the end of what it was for: once what was written
    went out, or now (`reset`) when some of it is still unsent, in asyncio or in the kernel.
    A sandbox that has not read it by then need never read it (a hostile tester pinned a
    descriptor and a megabyte a request so: answering a POST without reading its body, then
    neither reading nor closing)."""
    if transport.get_write_buffer_size() or unsent_in_kernel(transport):
        reset(transport)
    else:
        transport.close()


def reset(transport: asyncio.Transport) -> None:
    """Drop a connection to a sandbox now, with what is unsent, in its kernel too: a reset
    (SO_LINGER 0), not a FIN that would wait behind bytes the sandbox does not read."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
    transport.abort()


def unsent_in_kernel(transport: asyncio.BaseTransport) -> int:
    """Bytes in the kernel's send queue of `transport`'s socket not sent yet; 0 where that
    cannot be known (a tunnel's stream, a Unix socket, a kernel other than Linux's)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        got = fcntl.ioctl(sock.fileno(), _SIOCOUTNSQ, bytes(4))
    except (OSError, ValueError):  # not TCP, not Linux, or closed already
        return 0
    return int.from_bytes(got, sys.byteorder, signed=True)
