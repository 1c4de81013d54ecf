"""`WAKEFUL_INGRESS_WORKERS=2 wakeful up`: the ingress as two worker processes beside the one
that runs the rest, on the same store file. Both serve the client port; an app deployed while
they run reaches both; their access lines reach `wakeful logs`; their ingress token lives as
long as they do; SIGTERM stops them with everything else."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
from pathlib import Path

import anyio
import httpx
import pytest

from bench.procfs import gone, ingress_workers
from tests.support.up import Up, cli_async, make_app, no_sandbox_left, start_up, stop_up
from wakeful.domain.models import UP_INGRESS_TOKEN
from wakeful.up import routes_caught_up

pytestmark = pytest.mark.anyio


def read_only(up: Up) -> sqlite3.Connection:
    """`wakeful up`'s store file, opened to read (a test's look, beside its processes)."""
    return sqlite3.connect(f"file:{up.data_dir / 'store.db'}?mode=ro", uri=True)


def by_worker(up: Up, name: str, app: str) -> dict[str, float]:
    """`name`'s samples for `app` at the supervisor's /metrics, summed by worker."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{up.admin}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and f'app="{app}"' in line:
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            found[worker] = found.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


async def each_on_a_new_connection(up: Up, app: str, count: int) -> list[int]:
    statuses = []
    for _ in range(count):
        async with httpx.AsyncClient(base_url=up.proxy, timeout=30) as client:  # a new port
            statuses.append((await client.get("/", headers=up.host(app))).status_code)
    return statuses


async def test_two_workers_serve_follow_deploys_log_and_stop_with_up(tmp_path: Path) -> None:
    up = start_up(tmp_path, make_app(tmp_path), env={"WAKEFUL_INGRESS_WORKERS": "2"})
    try:
        # Routable as soon as the control file is there: a rollout writes the app's record
        # after its deploy returns, and once in five starts it came after the file (a 404).
        assert set(await each_on_a_new_connection(up, "hello", 5)) == {200}
        workers = ingress_workers(up.process.pid)
        assert len(workers) == 2, workers
        tokens = await cli_async(up, "tokens", "list")
        assert any(
            line.split()[:2] == [UP_INGRESS_TOKEN, "ingress"] for line in tokens.stdout.splitlines()
        )

        # Both workers take connections, and lease from the activator over the channel.
        assert set(await each_on_a_new_connection(up, "hello", 40)) == {200}
        answered = by_worker(up, "wakeful_ingress_requests_total", "hello")
        assert set(answered) == {"0", "1"} and sum(answered.values()) == 45, answered  # 5 + 40

        # Their access lines reach the control plane's log, one per request.
        async def access_lines() -> list[dict[str, object]]:
            done = await cli_async(up, "logs", "hello", "--access", "--json", "--since", "5m")
            return [json.loads(line) for line in done.stdout.splitlines()]

        for _ in range(150):
            if len(found := await access_lines()) >= 45:
                break
            await anyio.sleep(0.2)
        assert len(found) == 45 and {r["status"] for r in found} == {200}

        # An app deployed now is in both workers' routes (each follows the store file) by
        # the time `wakeful deploy` returns: it waits until each says so on its channel.
        second = make_app(tmp_path / "more", "second")
        deployed = await cli_async(up, "deploy", str(second))
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert "does not route" not in deployed.stderr, deployed.stderr
        with contextlib.closing(read_only(up)) as db:
            [(revision,)] = db.execute("SELECT revision FROM kv WHERE key = 'apps/second'")
        async with httpx.AsyncClient(base_url=up.api, timeout=30) as client:
            metrics = (await client.get(f"{up.admin}/metrics")).text
            assert routes_caught_up(metrics, 2, revision), metrics
            routed = await client.get(
                "/v1/apps/second/routed", headers={"Authorization": f"Bearer {up.token}"}
            )
        assert routed.json() == {
            "app": "second",
            "revision": revision,
            "ingresses": 2,
            "behind": {},
        }
        assert set(await each_on_a_new_connection(up, "second", 20)) == {200}
    finally:
        output = stop_up(up)
    assert up.process.returncode == 0, output
    assert all(gone(pid) for pid in workers), workers
    await no_sandbox_left(up)
    with contextlib.closing(
        sqlite3.connect(f"file:{up.data_dir / 'store.db'}?mode=ro", uri=True)
    ) as db:
        keys = [row[0] for row in db.execute("SELECT key FROM kv WHERE key LIKE 'tokens/%'")]
    assert keys == ["tokens/admin"], keys  # the workers' token went with them


def test_a_worker_count_out_of_range_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"error: WAKEFUL_INGRESS_WORKERS: must be 1 to 256 or 'auto' \(got '0'\)",
    ):
        start_up(tmp_path, make_app(tmp_path), env={"WAKEFUL_INGRESS_WORKERS": "0"})


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_taken_client_port_is_one_line_naming_it_with_workers_as_without(
    tmp_path: Path, workers: str
) -> None:
    """Two workers' supervisor keeps the port for them: when it is taken, `wakeful up` says so
    as the one process does, not in a traceback of both the bind and the workers' end."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as refused:
            start_up(
                tmp_path,
                make_app(tmp_path),
                env={"WAKEFUL_INGRESS_WORKERS": workers},
                proxy=port,
                attempts=1,  # the port is taken on purpose: once is the test
            )
    said = str(refused.value)
    assert f"wakeful: error: listen address 127.0.0.1:{port}: Address already in use" in said
    assert "Traceback" not in said, said
