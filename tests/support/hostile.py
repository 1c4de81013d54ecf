"""The hostile app (tests/security/hostile) for a test: its directory, told where to aim."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio

HOSTILE = Path(__file__).parents[1] / "security" / "hostile"


MEMORY, PROCESSES, DISK = 64 << 20, 32, 32 << 20


def write_hostile(
    root: Path, data_dir: Path, control_pid: int, ports: dict[str, int | str], marker: str
) -> Path:
    """The hostile app's directory, told where to aim (it learns nothing it could not guess)."""
    target = root / "hostile"
    shutil.copytree(HOSTILE, target)
    env = {
        "DATA_DIR": str(data_dir),
        "CONTROL_PID": str(control_pid),
        "PORTS": ",".join(f"{name}={port}" for name, port in ports.items()),
        "MARKER": marker,
        "MEMORY": str(MEMORY),
        "PROCESSES": str(PROCESSES),
        "DISK": str(DISK),
    }
    (target / "wakeful.toml").write_text(
        'name = "hostile"\ncommand = ["python3", "app.py"]\nshutdown_timeout = 5\n'
        '[health]\npath = "/healthz"\n'
        "[env]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items()) + "\n"
        f"[resources]\nmemory = {MEMORY}\nprocesses = {PROCESSES}\ndisk = {DISK}\n"
    )
    return target


@contextlib.contextmanager
def abstract_listener(marker: str) -> Iterator[None]:
    """The host's abstract UNIX socket the hostile app tries (app.py, `abstract_socket`)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("\0wakeful-hostile-" + marker)
        sock.listen()
        yield


def remove_written(marker: str) -> None:
    """What the unisolated run managed to write outside its directory."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"/etc/wakeful-pwned-{marker}")


async def processes_with(marker: str, within: float) -> list[int]:
    """Processes whose command line holds `marker`, once none is left or `within` passed."""
    found = await anyio.to_thread.run_sync(scan, marker)
    with anyio.move_on_after(within):
        while found:
            await anyio.sleep(0.1)
            found = await anyio.to_thread.run_sync(scan, marker)
    return found


ATTEMPTS = [
    "read the token file",
    "read /proc/1/environ",
    "read its parent's environ",
    "read the control plane's environ",
    "read store.db",
    "read another app's files",
    "read another app's secret",
    "write outside its directory",
    "signal the control plane",
    "fork past `processes`",
    "allocate past `memory`",
    "fill the disk",
    "create a user namespace",
    "connect to a host abstract socket",
    "connect to the control API",
    "connect to the ingress admin port",
    "connect to another app's port",
]


def scan(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
