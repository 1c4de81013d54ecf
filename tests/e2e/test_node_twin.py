"""`wakeful node` as a node another running agent holds (a cloned machine, a copied
configuration): it waits the record's TTL and a margin, then ends with one line naming what to
do, having written nothing; a stop signal while it waits ends it at once, cleanly, as it ends
a `wakeful up` that waits so. Of two agents that start together, one runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from wakeful.domain import keys
from wakeful.domain.models import Cordon, Node, Role, Token
from wakeful.store import Store, open_store
from wakeful.store.held import CLAIM_MARGIN, HeldRecord
from wakeful.store.testing import free_port
from wakeful.store.tokenbook import digest
from wakeful.testing import up_command

pytestmark = pytest.mark.anyio

TTL = 2
TOKEN = "n1-token-" + "x" * 32
RUNNING = Node(name="n1", address="10.0.0.9", agent="6f1c0b1e/1:2/other")


async def node_token(store: Store) -> None:
    """Node n1's token, as the control plane makes it: a node finds it in its store first."""
    token = Token(name="n1", role=Role.NODE, id="0a1b2c3d", sha256=digest(TOKEN))
    await store.put(keys.token("n1"), token)


@pytest.fixture
async def held_elsewhere(tmp_path: Path) -> AsyncIterator[tuple[str, Store]]:
    """A store file on which another agent holds node n1's record, renewing it."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url, shared=True) as store, anyio.create_task_group() as tasks:
        await node_token(store)
        other = HeldRecord(store, keys.node("n1"), RUNNING, ttl=TTL, what="the other agent")
        tasks.start_soon(other.run)
        await other.held.wait()
        yield url, store
        tasks.cancel_scope.cancel()


def node(url: str, data: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": url,
        "WAKEFUL_NODE_NAME": "n1",
        "WAKEFUL_NODE_TTL": str(TTL),
        "WAKEFUL_DATA_DIR": str(data),
        "WAKEFUL_NODE_TOKEN": TOKEN,
        "WAKEFUL_API": "http://127.0.0.1:9",  # not reached: nothing starts
        "WAKEFUL_ISOLATION": "none",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "wakeful.cli", "node"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def test_a_second_agent_of_a_running_node_is_refused_with_one_line(
    held_elsewhere: tuple[str, Store], tmp_path: Path
) -> None:
    url, store = held_elsewhere
    started = time.monotonic()
    with node(url, tmp_path / "data") as twin:
        out, _ = await anyio.to_thread.run_sync(lambda: twin.communicate(timeout=60))
    assert twin.returncode == 1, out
    assert time.monotonic() - started >= TTL + CLAIM_MARGIN
    assert "wakeful: error: node 'n1' is registered by another agent that still runs" in out
    assert "Traceback" not in out
    item = await store.get(keys.node("n1"), Node)
    assert item is not None and item.value == RUNNING  # the running agent's, untouched


async def test_a_stop_while_it_waits_ends_it_at_once(
    held_elsewhere: tuple[str, Store], tmp_path: Path
) -> None:
    url, _ = held_elsewhere
    with node(url, tmp_path / "data") as twin:
        assert twin.stdout is not None
        line = await anyio.to_thread.run_sync(twin.stdout.readline)
        assert "is registered by another agent" in line  # it is waiting now
        stopped = time.monotonic()
        twin.send_signal(signal.SIGTERM)
        out, _ = await anyio.to_thread.run_sync(lambda: twin.communicate(timeout=30))
    assert twin.returncode == 0, out
    assert time.monotonic() - stopped < TTL  # not after the wait


async def test_of_two_agents_started_together_one_runs(tmp_path: Path) -> None:
    """Both may find the record absent, each before the other writes it: the second write
    finds the first's and its agent ends with one line (or, had it looked later, it waits and
    is refused as above); the one that runs keeps its node, not cordoned."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with open_store(url, shared=True) as store:
        await node_token(store)  # the file made before either opens it
    twins = [node(url, tmp_path / f"data{i}") for i in (1, 2)]
    try:
        deadline = time.monotonic() + TTL + CLAIM_MARGIN + 20
        while all(twin.poll() is None for twin in twins) and time.monotonic() < deadline:  # noqa: ASYNC110 (processes)
            await anyio.sleep(0.1)
        ended = [twin for twin in twins if twin.poll() is not None]
        assert len(ended) == 1, "neither agent was refused"
        (loser,) = ended
        (winner,) = (twin for twin in twins if twin is not loser)
        out, _ = loser.communicate()
        assert loser.returncode == 1, out
        assert "wakeful: error: node 'n1' " in out and "another agent" in out, out
        assert "Traceback" not in out
        await anyio.sleep(TTL)  # the record outlives a TTL: the winner renews it
        async with open_store(url, shared=True) as store:
            assert await store.get(keys.node("n1"), Node) is not None
            assert await store.get(keys.cordon("n1"), Cordon) is None
        winner.send_signal(signal.SIGTERM)
        out, _ = await anyio.to_thread.run_sync(lambda: winner.communicate(timeout=30))
        assert winner.returncode == 0, out
    finally:
        for twin in twins:
            if twin.poll() is None:
                twin.kill()
                twin.wait()


def wakeful_up(data: Path) -> subprocess.Popen[str]:
    ports = {"proxy": free_port(), "api": free_port(), "admin": free_port()}
    return subprocess.Popen(
        up_command(data, [], idle_interval=1.0, **ports),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def test_wakeful_up_stopped_while_it_waits_for_its_nodes_record_ends_at_once(
    tmp_path: Path,
) -> None:
    """`wakeful up` on a data directory whose store has its node held by another agent (a
    copied directory, or its record from before a reboot) waits for it before the control
    plane starts; a Ctrl-C then ends it at once, not the TTL and margin later."""
    data = tmp_path / "state"
    data.mkdir(mode=0o700)
    held_there = Node(name="local", address="127.0.0.1", agent="6f1c0b1e/1:2/other")
    async with (
        open_store(f"sqlite:///{data / 'store.db'}", shared=True) as store,
        anyio.create_task_group() as tasks,
    ):
        other = HeldRecord(store, keys.node("local"), held_there, ttl=60, what="the other")
        tasks.start_soon(other.run)
        await other.held.wait()
        up = wakeful_up(data)
        try:
            assert up.stdout is not None
            with anyio.fail_after(30):
                while "is registered by another agent" not in (
                    line := await anyio.to_thread.run_sync(up.stdout.readline)
                ):
                    assert line, "wakeful up ended without waiting"
            stopped = time.monotonic()
            up.send_signal(signal.SIGTERM)
            out, _ = await anyio.to_thread.run_sync(lambda: up.communicate(timeout=30))
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
            assert up.stdout is not None
            up.stdout.close()
        assert up.returncode == 0, out
        assert time.monotonic() - stopped < 10  # not after its TTL (10 s) and the margin
        assert "Traceback" not in out
        assert not (data / "control.json").exists()  # it never came up
        tasks.cancel_scope.cancel()
    await other.release(within=5)
