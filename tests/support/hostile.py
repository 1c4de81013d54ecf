"""The hostile app (tests/security/hostile) for a test: its directory, told where to aim."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
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


def as_image(hostile: Path) -> Path:
    """The hostile app's directory made an image app's: the host's Python and app.py in an
    OCI archive beside its wakeful.toml (`image = "oci-archive:hostile.tar"`), its command
    and everything else unchanged."""
    from tests.support.images import (
        BUSYBOX,
        OciLayout,
        directory,
        file,
        layer,
        python_layer,
        symlink,
    )
    from wakeful.domain.models import ImageConfig

    layout = OciLayout(hostile / "layout")
    # The programs app.py runs besides Python (setsid, sleep, unshare), from a static busybox.
    tools = layer(
        directory("bin"),
        file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755),
        *(symlink(f"bin/{name}", "busybox") for name in ("sh", "setsid", "sleep", "unshare")),
    )
    app = layer(directory("app"), file("app/app.py", (hostile / "app.py").read_bytes()))
    config = ImageConfig(env=["PATH=/usr/bin:/bin"], working_dir="/app")
    layout.add_image("hostile", [python_layer(), tools, app], config)
    archive = hostile / "hostile.tar"
    subprocess.run(
        ["skopeo", "copy", "-q", f"oci:{layout.path}:hostile", f"oci-archive:{archive}"],
        check=True,
    )
    shutil.rmtree(layout.path)
    manifest = hostile / "wakeful.toml"
    text = manifest.read_text().replace(
        'name = "hostile"\n', 'name = "hostile"\nimage = "oci-archive:hostile.tar"\n', 1
    )
    manifest.write_text(text)
    return hostile


def written_outside(data_dir: Path, marker: str) -> list[str]:
    """What `write outside its directory` (app.py) left on this machine."""
    paths = [data_dir / "pwned", Path(f"/etc/wakeful-pwned-{marker}")]
    return [str(path) for path in paths if path.exists()]


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
