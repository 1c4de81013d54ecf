"""`wakeful up` as a real process for a test: an app directory made from examples/hello, the
process on free ports, its control API, and its stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from wakeful.node.testing import sandbox_pids
from wakeful.store.testing import free_port
from wakeful.testing import up_command

HELLO = Path(__file__).parents[2] / "examples" / "hello"


WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


def make_app(
    root: Path,
    name: str = "hello",
    *,
    rpi: int = 10,
    delay: str = "60s",
    max_instances: int = 10,
    command: str = '["python3", "app.py"]',
) -> Path:
    target = root / name
    shutil.copytree(HELLO, target)
    (target / "wakeful.toml").write_text(
        f'name = "{name}"\ncommand = {command}\nshutdown_timeout = 5\n'
        '[health]\npath = "/healthz"\ntimeout = 20\n'
        f'[concurrency]\nrequests_per_instance = {rpi}\nscale_down_delay = "{delay}"\n'
        f"max_instances = {max_instances}\n"
    )
    return target


@dataclass
class Up:
    process: subprocess.Popen[str]
    data_dir: Path
    proxy: str
    api: str
    token: str
    admin: str = ""
    """The ingress's admin address (its /metrics)."""

    def host(self, app: str = "hello") -> dict[str, str]:
        return {"Host": f"{app}.localhost"}

    async def pools(self) -> list[dict[str, object]]:
        async with httpx.AsyncClient(base_url=self.api) as client:
            answer = await client.get(
                "/v1/pools", headers={"Authorization": f"Bearer {self.token}"}
            )
        answer.raise_for_status()
        result: list[dict[str, object]] = answer.json()
        return result

    async def pool(self, app: str = "hello") -> dict[str, object]:
        return next(p for p in await self.pools() if p["app"] == app)

    def sandbox_pids(self) -> list[int]:
        return sandbox_pids(self.data_dir)


def start_up(
    tmp_path: Path,
    *apps: Path,
    idle_interval: float = 1.0,
    flags: Sequence[str] = (),
    within: float = 30,
    env: Mapping[str, str] | None = None,
    proxy: int | None = None,
    attempts: int = 3,
) -> Up:
    """`wakeful up` on free ports, up within `within` seconds (an app it builds first takes
    longer). A port found free can be taken before wakeful binds it (by any process's outgoing
    connection): then, and only then, it starts again on other ports, up to `attempts` starts
    in all. `env`: variables on top of this process's; `proxy`: the ingress's port, when the
    test must know it first."""
    for _ in range(attempts):
        up = _try_start(tmp_path, apps, idle_interval, flags, within, env or {}, proxy)
        if isinstance(up, Up):
            return up
        if "Address already in use" not in up:
            break
    raise RuntimeError(f"wakeful up did not start: {up}")


def _try_start(
    tmp_path: Path,
    apps: Sequence[Path],
    idle_interval: float,
    flags: Sequence[str],
    within: float,
    env: Mapping[str, str],
    proxy: int | None,
) -> Up | str:
    data_dir = tmp_path / "state"
    proxy, api, admin = proxy or free_port(), free_port(), free_port()
    process = subprocess.Popen(
        up_command(
            data_dir,
            apps,
            proxy=proxy,
            api=api,
            admin=admin,
            idle_interval=idle_interval,
            flags=flags,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )
    control = data_dir / "control.json"
    deadline = time.monotonic() + within
    while not control.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return process.communicate()[0]
        time.sleep(0.05)
    token = json.loads(control.read_text())["token"]
    return Up(
        process,
        data_dir,
        f"http://127.0.0.1:{proxy}",
        f"http://127.0.0.1:{api}",
        token,
        f"http://127.0.0.1:{admin}",
    )


def stop_up(up: Up) -> str:
    if up.process.poll() is None:
        up.process.send_signal(signal.SIGTERM)
        try:
            up.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.process.kill()
            up.process.wait()
    if up.process.stdout is None or up.process.stdout.closed:  # no output, or stopped before
        return ""
    with up.process.stdout:
        return up.process.stdout.read()


async def no_sandbox_left(up: Up, within: float = 20) -> None:
    """Stopping is SIGTERM and a wait: give the processes their moment to finish."""
    with anyio.fail_after(within):
        for _ in range(int(within * 20)):
            if not up.sandbox_pids():
                return
            await anyio.sleep(0.05)
    raise AssertionError(f"sandbox processes left: {up.sandbox_pids()}")


async def eventually_pool(
    up: Up, check: Callable[[dict[str, object]], bool], within: float = 30, app: str = "hello"
) -> dict[str, object]:
    """Wait until `check` holds for the app's pool report."""
    with anyio.fail_after(within):
        while True:
            pool = await up.pool(app)
            if check(pool):
                return pool
            await anyio.sleep(0.1)


def cli(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, "--data-dir", str(up.data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def cli_async(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: cli(up, *args))
