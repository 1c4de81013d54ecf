"""The suspended tier under `wakeful up` (issue 18), with real sandboxes: an idle app is
frozen, not stopped; its next request thaws the same process and is answered with no error,
saying so in `Server-Timing`; a stop while it is frozen leaves nothing behind, nor does a
SIGKILL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.up import eventually_pool, make_app, no_sandbox_left, start_up, stop_up
from wakeful.node.jail.cgroups import Cgroups
from wakeful.node.sandbox.workdir import clear_sandboxes

pytestmark = pytest.mark.anyio


async def test_an_idle_app_is_suspended_and_its_next_request_thaws_the_same_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WAKEFUL_LEASE_IDLE_TTL", "0.5")  # the ingress hands its lease back soon
    app = make_app(tmp_path, delay="600s")
    with (app / "wakeful.toml").open("a") as manifest:
        manifest.write('suspend_delay = "1s"\n')  # under [concurrency]
    up = start_up(tmp_path, app)
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            first = await client.get("/", headers=up.host())
            assert first.status_code == 200
            assert 'desc="start"' in first.headers["server-timing"]
            pool = await eventually_pool(up, lambda p: p["suspended"] == 1, within=60)
            assert (pool["live"], pool["ready"]) == (1, 0)
            pids = up.sandbox_pids()
            assert pids  # frozen, not stopped

            for _ in range(2):  # thawed, frozen again, thawed again: each time the same one
                answer = await client.get("/", headers=up.host())
                assert answer.status_code == 200
                assert answer.text == first.text  # the same process and instance
                timing = answer.headers["server-timing"]
                assert 'desc="thaw"' in timing and "wake;dur=" in timing
                assert up.sandbox_pids() == pids
                await eventually_pool(up, lambda p: p["suspended"] == 1, within=60)

            metrics = (await client.get(f"{up.api}/metrics")).text
            woken = {
                line.split("{")[1].split("}")[0]: float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("wakeful_activator_wake_seconds_count")
            }
            assert woken == {'kind="start"': 1.0, 'kind="thaw"': 2.0}
            assert (await up.pool())["desired_instances"] == 1  # nothing was started for it
    finally:
        stop_up(up)  # while frozen: the stop thaws it first
    await no_sandbox_left(up)


async def test_a_killed_wakeful_up_leaves_no_frozen_sandbox_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL while the app is frozen. A task in a frozen cgroup takes no signal, so the
    sandbox's parent-death SIGKILL would wait for a thaw that its dead agent never writes:
    its guard (`wakeful.node.jail.thawguard`) writes it, and the sandbox ends."""
    found = Cgroups.detect()
    if found is None or found.freezer is None:
        pytest.skip("no writable cgroup v1 freezer (not root?): SIGSTOP freezes, SIGKILL ends")
    monkeypatch.setenv("WAKEFUL_LEASE_IDLE_TTL", "0.5")
    app = make_app(tmp_path, delay="600s")
    with (app / "wakeful.toml").open("a") as manifest:
        manifest.write('suspend_delay = "1s"\n')
    up = start_up(tmp_path, app)
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            assert (await client.get("/", headers=up.host())).status_code == 200
        await eventually_pool(up, lambda p: p["suspended"] == 1, within=60)
        assert up.sandbox_pids()
        # The guard itself killed first: the agent starts another (its next look, within 0.5 s).
        (first,) = await guards(up.data_dir)
        os.kill(first, signal.SIGKILL)
        await guards(up.data_dir, not_=first)
        up.process.kill()
        up.process.wait()
        await no_sandbox_left(up)
    finally:
        stop_up(up)
        await anyio.to_thread.run_sync(clear_sandboxes, up.data_dir)  # as a restart would


async def guards(data_dir: Path, not_: int = 0, within: float = 30) -> list[int]:
    """The pids of the thaw guards watching `data_dir`'s sandboxes, once there is one that is
    not `not_`."""
    with anyio.fail_after(within):
        while True:
            found = await anyio.to_thread.run_sync(guard_pids, data_dir)
            if found and not_ not in found:
                return found
            await anyio.sleep(0.05)


def guard_pids(data_dir: Path) -> list[int]:
    mark = str((data_dir / "sandboxes").resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        guarding = any(a.endswith(b"thawguard.py") for a in argv) and mark in argv
        if guarding and state != "Z":  # a zombie is one killed, not yet reaped
            found.append(int(entry.name))
    return found
