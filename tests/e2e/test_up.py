"""`wakeful up` as a real process: real sandboxes, real HTTP through the ingress.

Each test starts its own `wakeful up` on free ports with a temporary data directory and an
app directory made from examples/hello with the settings the test needs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.up import (
    WAKEFUL,
    Up,
    eventually_pool,
    make_app,
    no_sandbox_left,
    start_up,
    stop_up,
)
from wakeful.node.testing import app_pids, sandbox_pids
from wakeful.store.testing import free_port
from wakeful.testing import up_command

pytestmark = pytest.mark.anyio


@pytest.fixture
def hello_up(tmp_path: Path) -> Iterator[Up]:
    up = start_up(tmp_path, make_app(tmp_path, rpi=2, delay="6s"))
    yield up
    stop_up(up)


@pytest.fixture
async def client(hello_up: Up) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=hello_up.proxy, timeout=60) as http:
        yield http


async def test_the_first_request_wakes_a_scaled_to_zero_app(
    hello_up: Up, client: httpx.AsyncClient
) -> None:
    assert (await hello_up.pool())["live"] == 0
    answer = await client.get("/", headers=hello_up.host())
    assert answer.status_code == 200
    assert answer.text.startswith("hello from")
    assert (await hello_up.pool())["ready"] == 1
    # The in-process node agent hands its output to the control plane's log book directly,
    # which writes it to the log directory before it answers.
    logs = [*WAKEFUL, "--data-dir", str(hello_up.data_dir), "logs", "hello"]
    with anyio.fail_after(30):
        while True:  # another process: polled, no event to wait on
            shown = (await anyio.run_process(logs)).stdout.decode()
            if "hello listening" in shown:
                break
            await anyio.sleep(0.2)
    assert re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z \[hello-v1-", shown), shown


async def test_a_burst_grows_the_pool_in_one_step_and_every_request_succeeds(
    hello_up: Up, client: httpx.AsyncClient
) -> None:
    statuses: list[int] = []
    refusals: list[str] = []

    async def one() -> None:
        answer = await client.get("/sleep", params={"s": "1"}, headers=hello_up.host())
        statuses.append(answer.status_code)
        if answer.status_code != 200:  # why, for the failure's message (it failed once in
            refusals.append(answer.text[:300])  # CI, all 503, and nothing said which)

    async with anyio.create_task_group() as burst:
        for _ in range(12):
            burst.start_soon(one)
    pool = await hello_up.pool()
    assert statuses == [200] * 12, (statuses, refusals[:3], pool)
    # 12 requests at target 2 need 6 sandboxes (7 with a lease of headroom). Each scale-up
    # write is sized from the whole demand known when it is made; requests still arriving
    # while a write is in flight can add writes, but the size covers every request, where
    # growing by a step per saturated admission would lag behind it.
    assert int(pool["desired_instances"]) >= 6  # type: ignore[call-overload]


async def test_an_idle_app_goes_to_zero_and_the_next_request_wakes_it(
    hello_up: Up, client: httpx.AsyncClient
) -> None:
    assert (await client.get("/", headers=hello_up.host())).status_code == 200
    await eventually_pool(
        hello_up, lambda p: p["desired_instances"] == 0 and p["live"] == 0, within=60
    )
    await no_sandbox_left(hello_up)
    answer = await client.get("/", headers=hello_up.host())
    assert answer.status_code == 200


async def test_scale_down_under_steady_load_drops_no_request(
    hello_up: Up, client: httpx.AsyncClient
) -> None:
    statuses: list[int] = []
    refused: list[str] = []

    async def one() -> None:
        answer = await client.get("/sleep", params={"s": "0.5"}, headers=hello_up.host())
        statuses.append(answer.status_code)
        if answer.status_code != 200:  # what it said, for whoever reads a failure
            refused.append(f"{answer.status_code} {answer.text[:300]!r}")

    async with anyio.create_task_group() as burst:  # grow the pool first
        for _ in range(10):
            burst.start_soon(one)
    grown = int((await hello_up.pool())["desired_instances"])  # type: ignore[call-overload]
    assert grown >= 3
    # Steady light load while the idle monitor takes the unused sandboxes away.
    with anyio.fail_after(90):
        while int((await hello_up.pool())["live"]) > 1:  # type: ignore[call-overload]
            await one()
    for _ in range(5):
        await one()
    assert set(statuses) == {200}, refused


async def test_a_killed_sandbox_is_replaced(hello_up: Up, client: httpx.AsyncClient) -> None:
    first = await client.get("/", headers=hello_up.host())
    (pid,) = app_pids(hello_up.data_dir, "app.py")  # its pid on this machine, not in the jail
    os.kill(pid, signal.SIGKILL)
    with anyio.fail_after(30):
        while True:
            answer = await client.get("/", headers=hello_up.host())
            if answer.status_code == 200 and answer.text.split()[-1] != first.text.split()[-1]:
                break  # another instance answers
            await anyio.sleep(0.1)
    assert pid not in hello_up.sandbox_pids()


async def test_a_crash_looping_app_answers_503_with_its_log_quickly(tmp_path: Path) -> None:
    app = make_app(
        tmp_path,
        "broken",
        command=(
            '["python3", "-c", '
            "\"import sys; print('ImportError: no module named flask'); sys.exit(1)\"]"
        ),
    )
    up = start_up(tmp_path, app)
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as http:
            started = time.monotonic()
            answer = await http.get(
                "/", headers={**up.host("broken"), "Accept": "application/json"}
            )
            elapsed = time.monotonic() - started
        assert answer.status_code == 503
        assert "Retry-After" in answer.headers
        assert "flask" in answer.text
        assert elapsed < 30  # far below the 120 s activation timeout
    finally:
        stop_up(up)


def test_a_bad_manifest_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    app = make_app(tmp_path, rpi=0)
    data_dir = tmp_path / "state"
    done = subprocess.run(
        [*WAKEFUL, "--data-dir", str(data_dir), "up", str(app)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "concurrency.requests_per_instance" in done.stderr
    assert "wakeful.toml" in done.stderr
    assert not (data_dir / "store.db").exists()


async def test_sigterm_leaves_no_sandbox_running(tmp_path: Path) -> None:
    up = start_up(tmp_path, make_app(tmp_path, rpi=1))
    async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as http:

        async def one() -> None:
            await http.get("/sleep", params={"s": "0.2"}, headers=up.host())

        async with anyio.create_task_group() as burst:
            for _ in range(4):
                burst.start_soon(one)
    assert up.sandbox_pids() != []
    output = stop_up(up)
    assert up.process.returncode == 0, output
    assert up.sandbox_pids() == []


def _mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts if line.split()[1].startswith(str(root))]


@pytest.mark.parametrize("after", [0.0, 0.03, 0.5, 1.0])
def test_sigterm_while_starting_stops_in_order_and_leaves_nothing(
    tmp_path: Path, after: float
) -> None:
    """Told to stop at some moment of its start (`after` seconds from the start, or, for
    0.0 and 0.03, from when its control file appears, as a script that waits for it would),
    `wakeful up` finishes starting, then stops as usual: no sandbox, no mount left behind.
    (SIGTERM's default action once killed it between writing its control file and waiting
    for signals, leaving its warm sandboxes' tmpfs mounts; only a signal that comes before
    Python runs wakeful's code at all may still kill it, and then nothing was started.)"""
    data_dir = tmp_path / "state"
    ports = [free_port() for _ in range(3)]
    process = subprocess.Popen(
        up_command(
            data_dir,
            [make_app(tmp_path)],
            proxy=ports[0],
            api=ports[1],
            admin=ports[2],
            idle_interval=1.0,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if after < 0.1:
        deadline = time.monotonic() + 30
        while not (data_dir / "control.json").exists() and time.monotonic() < deadline:
            time.sleep(0.002)
    time.sleep(after)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=60)[0]
    assert process.returncode in (0, -signal.SIGTERM), output
    if process.returncode:
        assert not (data_dir / "sandboxes").exists(), output  # killed before it began
    assert sandbox_pids(data_dir) == []
    assert _mounts_under(tmp_path) == [], output
