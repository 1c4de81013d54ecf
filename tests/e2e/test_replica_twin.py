"""`wakeful ingress` taking tunnels under a replica name another running ingress holds at
another relay address (a copied configuration): it waits the record's TTL and a margin, then
ends with one line naming what to do, having served nothing. Before, both ran: the later one's
`ingresses/` record replaced the other's, and peers and nodes relayed to one of the two by
name. The same ingress killed and started again is not held up by its own record."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.support.pieces import Plane, control_plane_with_tokens, ingress_env, piece
from tests.support.up import WAKEFUL
from wakeful.domain import keys
from wakeful.domain.models import IngressReplica
from wakeful.store import open_store
from wakeful.store.held import CLAIM_MARGIN, HeldRecord
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio

TTL = 5
"""Renewed every 1.7 s here: a loaded machine's stall does not let the running one lapse."""
RUNNING = IngressReplica(name="r1", relay="10.0.0.9:7001")


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    async with control_plane_with_tokens(tmp_path) as running:
        yield running


def tunnel_env(plane: Plane, ttl: int, port: int) -> dict[str, str]:
    return {
        **ingress_env(plane, plane.ingress),
        "WAKEFUL_STORE_URL": plane.store_url,
        "WAKEFUL_TUNNEL_LISTEN": f"127.0.0.1:{port}",
        "WAKEFUL_TUNNEL_REPLICA": "r1",
        "WAKEFUL_TUNNEL_RECORD_TTL": str(ttl),
    }


def ingress(env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """`wakeful ingress` with `env`, its output (and errors) read line by line."""
    return subprocess.Popen(
        [*WAKEFUL, "ingress"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def test_a_second_replica_of_a_running_name_is_refused_with_one_line(
    plane: Plane, tmp_path: Path
) -> None:
    async with open_store(plane.store_url, shared=True) as store:
        other = HeldRecord(store, keys.ingress("r1"), RUNNING, ttl=TTL, what="the other")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(other.run)
            await other.held.wait()
            started = time.monotonic()
            status, said = await piece(tmp_path, "ingress", tunnel_env(plane, TTL, free_port()))
            assert status == 1, said
            assert time.monotonic() - started >= TTL + CLAIM_MARGIN
            assert (
                "wakeful: error: ingress replica 'r1' is registered by another ingress that "
                "still runs, relaying at 10.0.0.9:7001: two replicas of one name would take "
                "each other's tunnels and relays; give this one a name of its own "
                "(WAKEFUL_TUNNEL_REPLICA) or stop the other"
            ) in said, said
            assert "listening" not in said and "Traceback" not in said
            item = await store.get(keys.ingress("r1"), IngressReplica)
            assert item is not None and item.value == RUNNING  # untouched
            tasks.cancel_scope.cancel()
        await other.release(within=5)


async def test_a_replica_killed_and_started_again_is_not_held_up_by_its_record(
    plane: Plane, tmp_path: Path
) -> None:
    """Its record outlives a SIGKILL by its TTL (30 s here); it relays at the same address,
    so the next run takes its name at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    env.update(tunnel_env(plane, 30, free_port()))

    async def started(procs: list[subprocess.Popen[str]]) -> float:
        """Seconds until a new `wakeful ingress` (appended to `procs`) says it listens."""
        at = time.monotonic()
        proc = ingress(env, tmp_path)
        procs.append(proc)
        assert proc.stdout is not None
        with anyio.fail_after(60):
            while line := await anyio.to_thread.run_sync(
                proc.stdout.readline, abandon_on_cancel=True
            ):
                if "ingress listening on" in line:  # after it took its name and tunnels
                    return time.monotonic() - at
        raise AssertionError(f"ended before it took tunnels: {proc.wait()}")

    procs: list[subprocess.Popen[str]] = []
    try:
        await started(procs)
        async with open_store(plane.store_url, shared=True) as store:
            with anyio.fail_after(10):  # its record, written as it serves
                while await store.get(keys.ingress("r1"), IngressReplica) is None:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(timeout=10)
            left = await store.get(keys.ingress("r1"), IngressReplica)
            assert left is not None  # the killed run's record, until its TTL
        took = await started(procs)
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(timeout=30) == 0
    finally:
        for proc in procs:  # a failed assertion leaves none running
            with proc:
                proc.kill()
    assert took < 15, took  # not its record's 30 s and the margin


async def test_a_stop_while_it_waits_for_its_name_ends_it_at_once(
    plane: Plane, tmp_path: Path
) -> None:
    """Before, the signal went to a receiver nothing read while it started: the ingress went
    on waiting for its name (and, had the name come free, served)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    env.update(tunnel_env(plane, TTL, free_port()))
    async with open_store(plane.store_url, shared=True) as store:
        other = HeldRecord(store, keys.ingress("r1"), RUNNING, ttl=TTL, what="the other")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(other.run)
            await other.held.wait()
            twin = ingress(env, tmp_path)
            try:
                assert twin.stdout is not None
                with anyio.fail_after(30):
                    line = await anyio.to_thread.run_sync(
                        twin.stdout.readline, abandon_on_cancel=True
                    )
                assert "is registered by another ingress" in line, line  # it waits now
                stopped = time.monotonic()
                twin.send_signal(signal.SIGTERM)
                out, _ = await anyio.to_thread.run_sync(lambda: twin.communicate(timeout=30))
            finally:
                with twin:  # a failed assertion must not leave it running (nor the test waiting)
                    twin.kill()
            assert twin.returncode == 0, out
            assert time.monotonic() - stopped < TTL, out  # not the rest of the claim's wait
            assert "listening" not in out and "Traceback" not in out, out
            tasks.cancel_scope.cancel()
        await other.release(within=5)
