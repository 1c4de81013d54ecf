"""Deploys, rollbacks and idleness through `wakeful up` as a real process (issue 6)."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.up import Up, cli_async, make_app, start_up, stop_up

pytestmark = pytest.mark.anyio


class Prober:
    """Requests one after another (a few in parallel) until stopped; records every status."""

    def __init__(self, up: Up) -> None:
        self.up = up
        self.statuses: list[int] = []
        self.pids: set[str] = set()
        self.stop = anyio.Event()

    async def run(self, client: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            answer = await client.get("/sleep", params={"s": "0.05"}, headers=self.up.host())
            self.statuses.append(answer.status_code)
            self.pids.add(answer.text.split()[-1])


async def test_a_deploy_under_load_fails_no_request_and_starts_at_the_old_size(
    tmp_path: Path,
) -> None:
    app = make_app(tmp_path, rpi=1)
    up = start_up(tmp_path, app)
    try:
        prober = Prober(up)
        async with (
            httpx.AsyncClient(base_url=up.proxy, timeout=60) as client,
            anyio.create_task_group() as load,
        ):
            for _ in range(3):
                load.start_soon(prober.run, client)
            with anyio.fail_after(30):
                while int((await up.pool())["ready"]) < 2:  # type: ignore[call-overload]  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            old = await up.pool()
            manifest = (app / "wakeful.toml").read_text()
            (app / "wakeful.toml").write_text(
                manifest.replace(
                    "shutdown_timeout = 5", 'shutdown_timeout = 5\nenv = { MARK = "2" }'
                )
            )
            done = await cli_async(up, "deploy", str(app))
            assert done.returncode == 0, done.stdout + done.stderr
            assert "v2 is live" in done.stdout
            pools = {p["version"]: p for p in await up.pools()}
            await anyio.sleep(1)
            prober.stop.set()
        assert prober.statuses and set(prober.statuses) == {200}
        assert int(pools["v2"]["desired_instances"]) >= int(old["desired_instances"])  # type: ignore[call-overload]
    finally:
        stop_up(up)


async def test_a_failed_deploy_keeps_the_old_version_and_rollback_works(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    up = start_up(tmp_path, app)
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            first = await client.get("/", headers=up.host())
            assert first.status_code == 200
            manifest = (app / "wakeful.toml").read_text()
            (app / "wakeful.toml").write_text(
                manifest.replace(
                    'command = ["python3", "app.py"]',
                    'command = ["python3", "-c", "raise SystemExit(\'bad release\')"]',
                )
            )
            failed = await cli_async(up, "deploy", str(app))
            assert failed.returncode == 1
            assert "abandoned" in failed.stdout and "bad release" in failed.stdout
            still = await client.get("/", headers=up.host())
            assert still.status_code == 200 and still.text.startswith("hello from")

            (app / "wakeful.toml").write_text(
                manifest.replace("max_instances = 10", "max_instances = 9")
            )
            good = await cli_async(up, "deploy", str(app))
            assert good.returncode == 0, good.stdout + good.stderr
            versions = await cli_async(up, "versions", "hello")
            assert "* v3" in versions.stdout
            back = await cli_async(up, "rollback", "hello")
            assert back.returncode == 0, back.stdout + back.stderr
            versions = await cli_async(up, "versions", "hello")
            assert "* v1" in versions.stdout
            assert (await client.get("/", headers=up.host())).status_code == 200
            unchanged = await cli_async(up, "deploy", str(app))
            assert unchanged.returncode == 0
            assert "v4" in unchanged.stdout or "live" in unchanged.stdout
    finally:
        stop_up(up)


async def test_steady_traffic_is_never_scaled_down(tmp_path: Path) -> None:
    up = start_up(tmp_path, make_app(tmp_path, delay="5s"), idle_interval=0.5)
    try:
        prober = Prober(up)
        async with (
            httpx.AsyncClient(base_url=up.proxy, timeout=60) as client,
            anyio.create_task_group() as load,
        ):
            load.start_soon(prober.run, client)
            await anyio.sleep(15)  # three times the scale_down_delay
            prober.stop.set()
        assert set(prober.statuses) == {200}
        assert len(prober.pids) == 1  # one sandbox served it all: never stopped, never cold
        assert (await up.pool())["desired_instances"] == 1
    finally:
        stop_up(up)
