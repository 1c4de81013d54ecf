"""One agent is one node (`wakeful.node.registration`): a second agent on the same data
directory, or of a node another running agent holds, is refused before it writes anything;
a previous run's record (its lease running out, or from this node's own address) is not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.support.node import agent_settings
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.models import Node
from wakeful.node.agent import NodeAgent
from wakeful.node.registration import CLAIM_MARGIN, NodeTaken, held_data_dir
from wakeful.node.settings import NodeSettings
from wakeful.node.testing import FakeSecrets
from wakeful.store import Store, open_store
from wakeful.store.held import HeldRecord

pytestmark = pytest.mark.anyio

TTL = 2


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with open_store("memory://") as opened:
        yield opened


def agent(store: Store, settings: NodeSettings, tmp_path: Path) -> NodeAgent:
    artifacts = LocalArtifacts(tmp_path / "artifacts")
    keeper = StateKeeper(store, artifacts).for_node(settings.node_name)
    return NodeAgent(store, settings, artifacts, keeper, FakeSecrets())


def elsewhere(address: str = "10.0.0.9") -> Node:
    return Node(name="n1", address=address)


async def test_a_second_agent_on_one_data_directory_is_refused_and_writes_nothing(
    store: Store, tmp_path: Path
) -> None:
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    refused = pytest.raises(NodeTaken, match="another node agent runs on the data directory")
    with held_data_dir(settings.data_dir), refused, anyio.fail_after(10):  # the first agent's
        await agent(store, settings, tmp_path).run()
    listing = await store.list(keys.CORDONS, Node)
    assert listing.items == [] and listing.invalid == []  # no cordon left for n1
    assert await store.get(keys.node("n1"), Node) is None
    with held_data_dir(settings.data_dir):  # released by the one that was refused, too
        pass


async def test_an_agent_of_a_node_another_running_agent_holds_is_refused(
    store: Store, tmp_path: Path
) -> None:
    """The other agent (another machine: another address) renews its record; this one waits
    its TTL and the margin, then gives up naming the address and what to do, having written
    nothing: the other's record and sandboxes are untouched."""
    other = HeldRecord(store, keys.node("n1"), elsewhere(), ttl=TTL, what="the other agent")
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(other.run)
        await other.held.wait()
        started = anyio.current_time()
        with anyio.fail_after(TTL + CLAIM_MARGIN + 10):
            with pytest.raises(NodeTaken, match=r"registered from 10\.0\.0\.9 .* still runs"):
                await agent(store, settings, tmp_path).run()
        assert anyio.current_time() - started >= TTL + CLAIM_MARGIN
        item = await store.get(keys.node("n1"), Node)
        assert item is not None and item.value.address == "10.0.0.9"
        tasks.cancel_scope.cancel()
    await other.release(within=5)


async def test_a_previous_runs_record_from_another_address_is_waited_out(
    store: Store, tmp_path: Path
) -> None:
    """The node's address changed since its last run, which died without releasing its record:
    the record goes once its lease runs out (deleted here), and the agent starts then."""
    await store.put(keys.node("n1"), elsewhere())
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    registration = agent(store, settings, tmp_path)._registration
    async with anyio.create_task_group() as tasks:

        async def expire() -> None:
            await anyio.sleep(1)
            await store.delete(keys.node("n1"))

        tasks.start_soon(expire)
        with anyio.fail_after(TTL + CLAIM_MARGIN):
            await registration.claim(poll=0.05)


async def test_a_record_from_this_nodes_own_address_is_its_previous_run(
    store: Store, tmp_path: Path
) -> None:
    """Killed on this machine, restarted at once: its record still lives out its lease, and the
    data directory's lock (free: the kernel released it) says no agent of it runs."""
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    await store.put(keys.node("n1"), elsewhere(settings.node_address))
    with anyio.fail_after(1):
        await agent(store, settings, tmp_path)._registration.claim()


def test_the_lock_is_the_kernels_once_the_process_ends(tmp_path: Path) -> None:
    """A killed agent's lock goes with it: a process that took it and was killed leaves it
    free for the next."""
    data = tmp_path / "data"
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from wakeful.node.registration import held_data_dir\n"
            "with held_data_dir(Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(60)",
            str(data),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            with pytest.raises(NodeTaken), held_data_dir(data):
                pass
        finally:
            holder.kill()
    with held_data_dir(data):
        pass
