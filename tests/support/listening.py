"""Whether a process a test started is the one listening on the port it was given: a port
found free (`free_port`) can be taken by another test's server (another worker's) before the
process binds it; then something answers there, but not it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path


def listens(proc: subprocess.Popen[bytes], port: int, within: float = 10.0) -> bool:
    """Until `proc` listens on `port` (any address): True; False once it exited (a server
    that cannot bind its port exits); TimeoutError past `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if _listener_inodes(port) & _socket_inodes(proc.pid):
            return True
        time.sleep(0.02)
    raise TimeoutError(f"nothing listened on port {port} within {within} s")


def _listener_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on `port`, any address (/proc/net/tcp, tcp6)."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
                found.add(fields[9])
    return found


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets `pid` holds open."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    found.add(target[len("socket:[") : -1])
    return found
