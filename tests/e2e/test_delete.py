"""`wakeful delete APP` through a real `wakeful up`: the request in flight finishes, new ones
find no app, the sandboxes stop, and the app's pool and artifact are gone."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.up import Up, make_app, no_sandbox_left, start_up, stop_up

pytestmark = pytest.mark.anyio
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
FIRST = 128 * 1024


async def in_flight(up: Up) -> float:
    async with httpx.AsyncClient(base_url=up.admin) as admin:
        for line in (await admin.get("/metrics")).text.splitlines():
            if line.startswith('wakeful_ingress_requests_in_flight{app="hello"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_delete_lets_the_request_in_flight_finish_then_removes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No grace for unreferenced artifacts (10 min by default): the delete's own collection
    # removes the app's artifact at once (the grace is proved in tests/deploy/test_artifact_gc.py).
    monkeypatch.setenv("WAKEFUL_ARTIFACT_GRACE", "0")
    up = start_up(tmp_path, make_app(tmp_path))
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as http:
            assert (await http.get("/", headers=up.host())).status_code == 200
            statuses: list[int] = []
            release = anyio.Event()
            deleted: list[subprocess.CompletedProcess[str]] = []

            async def slow() -> None:
                # In flight until the test releases the rest of its body, however slow the
                # machine: the delete certainly happens while it runs. The first part is past
                # what the ingress reads before it forwards a request (64 KiB), so the request
                # reaches the sandbox before the rest comes.
                async def body() -> AsyncIterator[bytes]:
                    yield b"x" * FIRST
                    await release.wait()
                    yield b"x" * 1024

                length = str(FIRST + 1024)
                answer = await http.post(
                    "/", content=body(), headers={**up.host(), "Content-Length": length}
                )
                statuses.append(answer.status_code)

            def delete() -> None:
                deleted.append(
                    subprocess.run(
                        [*WAKEFUL, "--data-dir", str(up.data_dir), "delete", "hello"],
                        capture_output=True,
                        text=True,
                        timeout=120,
                        check=False,
                    )
                )

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow)
                with anyio.fail_after(30):
                    while await in_flight(up) < 1:  # noqa: ASYNC110 - polled over HTTP
                        await anyio.sleep(0.02)
                tasks.start_soon(anyio.to_thread.run_sync, delete)
                with anyio.fail_after(60):  # the route goes first: new requests find no app
                    while (await http.get("/", headers=up.host())).status_code != 404:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                assert statuses == []  # still in flight, its sandbox still serving it
                release.set()
            (done,) = deleted
            assert done.returncode == 0, done.stdout + done.stderr
            assert "hello is gone" in done.stdout
            assert statuses == [200]
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
