"""`wakeful delete APP` through a real `wakeful up`: the request in flight finishes, new ones
find no app, the sandboxes stop, and the app's pool and artifact are gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.test_up import make_app, no_sandbox_left, start_up, stop_up

pytestmark = pytest.mark.anyio
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


async def test_delete_lets_the_request_in_flight_finish_then_removes_everything(
    tmp_path: Path,
) -> None:
    up = start_up(tmp_path, make_app(tmp_path))
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as http:
            assert (await http.get("/", headers=up.host())).status_code == 200
            statuses: list[int] = []

            async def slow() -> None:
                answer = await http.get("/sleep", params={"s": "2"}, headers=up.host())
                statuses.append(answer.status_code)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow)
                with anyio.fail_after(30):
                    while int((await up.pool())["leased"]) == 0:  # type: ignore[call-overload]  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                done = await anyio.to_thread.run_sync(
                    lambda: subprocess.run(
                        [*WAKEFUL, "--data-dir", str(up.data_dir), "delete", "hello"],
                        capture_output=True,
                        text=True,
                        timeout=120,
                        check=False,
                    )
                )
            assert done.returncode == 0, done.stdout + done.stderr
            assert "hello is gone" in done.stdout
            assert statuses == [200]
            after = await http.get("/", headers=up.host())
            assert after.status_code == 404
        await no_sandbox_left(up)
        assert await up.pools() == []
        assert list((up.data_dir / "artifacts").iterdir()) == []
        again = await anyio.run_process(
            [*WAKEFUL, "--data-dir", str(up.data_dir), "delete", "hello"], check=False
        )
        assert again.returncode != 0
        assert b"404" in again.stderr and b"hello" in again.stderr
    finally:
        stop_up(up)
