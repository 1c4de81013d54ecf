"""One agent is one node (`wakeful.node.registration`): a second agent on the same data
directory, or of a node another running agent holds, is refused before it writes anything;
a previous run's record (its lease running out, or the agent's own) is not in the way."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from tests.support.node import agent_settings, place, put_hello, status_of
from tests.support.store import pass_time
from wakeful.aio.packing import pack
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.models import AppSpec, Cordon, HealthCheck, Node, Sandbox, SandboxStatus
from wakeful.node.agent import NodeAgent
from wakeful.node.registration import NodeTaken, agent_identity, claim, held_data_dir
from wakeful.node.settings import NodeSettings
from wakeful.node.testing import FakeSecrets
from wakeful.store import Store, open_store
from wakeful.store.etcd import EtcdStore
from wakeful.store.held import CLAIM_MARGIN, Claim, HeldRecord, claim_step
from wakeful.store.testing import EtcdServer
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio

TTL = 2
HELLO = pack(Path(__file__).parents[2] / "examples" / "hello")
SPEC = AppSpec(command=[sys.executable, "app.py"], health=HealthCheck(path="/healthz"))


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    async with open_store("memory://") as opened:
        yield opened


def record(agent: str, address: str = "127.0.0.1") -> Node:
    """Node n1's record as an agent writes it; the address is this node's own (the default)
    unless said: an agent is told apart by its identity, not by where it is."""
    return Node(name="n1", address=address, agent=agent)


def node_agent(store: Store, settings: NodeSettings, tmp_path: Path, agent: str) -> NodeAgent:
    """Node n1's agent, with identity `agent`."""
    artifacts = LocalArtifacts(tmp_path / "artifacts")
    keeper = StateKeeper(store, artifacts).for_node("n1")
    return NodeAgent(store, settings, artifacts, keeper, FakeSecrets(), agent=agent)


def test_a_second_agent_on_one_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    refused = pytest.raises(NodeTaken, match=r"another node agent .* runs on the data directory")
    with held_data_dir(data) as first, refused, held_data_dir(data):
        pass
    with held_data_dir(data) as again:  # released by both
        assert again == first  # the same directory on the same boot: the same agent


def test_an_agents_identity_is_its_directory_and_the_machines_boot(tmp_path: Path) -> None:
    boot, other_boot = tmp_path / "boot", tmp_path / "other-boot"
    boot.write_text("6f1c0b1e-aaaa\n")
    other_boot.write_text("0d9e22aa-bbbb\n")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    mine = agent_identity(one, boot)
    assert agent_identity(one, boot) == mine  # kept in the directory
    assert agent_identity(two, boot) != mine  # another directory on this machine
    assert agent_identity(one, other_boot) != mine  # a copy of it on a cloned machine
    copy = tmp_path / "copy"
    shutil.copytree(one, copy)  # `cp -a`, a volume snapshot: agent.id comes along
    assert (copy / "agent.id").read_text() == (one / "agent.id").read_text()
    assert agent_identity(copy, boot) != mine
    assert mine.startswith("6f1c0b1e/")


async def test_an_agent_says_its_identity_in_its_record_and_passes_its_own_claim(
    store: Store, tmp_path: Path
) -> None:
    """The wiring: the identity an agent is given is the one its record carries, so its next
    run (the same identity) is not held up by it, and another agent is."""
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    agent = node_agent(store, settings, tmp_path, "boot/mine")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(agent.run)
        with anyio.fail_after(10):
            await agent.wait_registered()
        item = await store.get(keys.node("n1"), Node)
        assert item is not None and item.value.agent == "boot/mine"
        with anyio.fail_after(1):
            await claim(store, settings, "boot/mine")
        with anyio.move_on_after(1) as waited:
            await claim(store, settings, "boot/other")
        assert waited.cancelled_caught  # still waiting for the running agent's record
        tasks.cancel_scope.cancel()


async def test_an_agent_of_a_node_another_running_agent_holds_is_refused(
    store: Store, tmp_path: Path
) -> None:
    """The other agent (another directory on the same machine: the same address) renews its
    record; this one waits its TTL and the margin, then gives up saying what to do, having
    written nothing: the other's record is untouched."""
    other = HeldRecord(store, keys.node("n1"), record("boot/other"), ttl=TTL, what="the other")
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(other.run)
        await other.held.wait()
        started = anyio.current_time()
        with (
            anyio.fail_after(TTL + CLAIM_MARGIN + 10),
            pytest.raises(NodeTaken, match=r"still runs .*\(WAKEFUL_NODE_NAME\)"),
        ):
            await claim(store, settings, "boot/mine", poll=0.1)
        assert anyio.current_time() - started >= TTL + CLAIM_MARGIN
        item = await store.get(keys.node("n1"), Node)
        assert item is not None and item.value.agent == "boot/other"
        tasks.cancel_scope.cancel()
    await other.release(within=5)


async def test_an_agent_that_passed_its_claim_with_another_is_stopped_at_its_record(
    store: Store, tmp_path: Path
) -> None:
    """Two agents that looked at the same moment both found the record gone (`claim` let
    both through): the one whose record came second is stopped at its first write, before it
    settles anything, and leaves the other's node as it was: no record of its own, no
    cordon."""
    other = HeldRecord(store, keys.node("n1"), record("boot/other"), ttl=TTL, what="the other")
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    agent = node_agent(store, settings, tmp_path, "boot/mine")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(other.run)
        await other.held.wait()
        with (
            anyio.fail_after(10),
            pytest.RaisesGroup(
                pytest.RaisesExc(NodeTaken, match=r"registered by another agent \(at 127"),
                flatten_subgroups=True,
            ),
        ):
            await agent.run()  # its claim passed before the other's record was written
        item = await store.get(keys.node("n1"), Node)
        assert item is not None and item.value.agent == "boot/other"
        assert await store.get(keys.cordon("n1"), Cordon) is None
        tasks.cancel_scope.cancel()
    await other.release(within=5)


async def test_an_agent_whose_lapsed_record_another_took_stops_and_leaves_the_node_be(
    tmp_path: Path,
) -> None:
    """The store out of reach past the record's TTL (its clock moved here): the record goes,
    and another agent of the node registers meanwhile. When this one can write again it finds
    the other's record: it stops, its sandbox with it, and neither cordons the node nor
    touches the other's record (the sandbox's drain used to cordon it first)."""
    clock = ManualClock(time.time())
    async with open_store("memory://", clock=clock) as store:
        await put_hello(store, SPEC, await LocalArtifacts(tmp_path / "artifacts").put(HELLO))
        settings = agent_settings(tmp_path / "data", node_ttl=TTL, shutdown_drain=0.2)
        agent = node_agent(store, settings, tmp_path, "boot/mine")
        with pytest.RaisesGroup(
            pytest.RaisesExc(NodeTaken, match=r"registered by another agent .* now: .* lapsed"),
            flatten_subgroups=True,
        ):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(agent.run)
                with anyio.fail_after(10):
                    await agent.wait_registered()
                await place(store, "sb-1", "hello-v1")
                await status_of(store, "sb-1", SandboxStatus.RUNNING)
                await pass_time(store, clock, TTL + 1)  # its lease expires, its record goes
                assert await store.get(keys.node("n1"), Node) is None
                await store.put(keys.node("n1"), record("boot/other"))
                with anyio.fail_after(10):
                    await anyio.sleep_forever()  # until the agent ends, at its next renewal
        item = await store.get(keys.node("n1"), Node)
        assert item is not None and item.value.agent == "boot/other"
        assert await store.get(keys.cordon("n1"), Cordon) is None
        sandbox = await store.get(keys.sandbox("sb-1"), Sandbox)
        assert sandbox is not None and sandbox.value.status is SandboxStatus.STOPPED


async def test_a_previous_runs_record_is_waited_out(store: Store, tmp_path: Path) -> None:
    """A run that died without releasing its record, from another directory (or before a
    reboot): the record goes once its lease runs out (deleted here), and not before, the claim
    returns."""
    await store.put(keys.node("n1"), record("boot/before"))
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    claimed = anyio.Event()

    async def claim_it() -> None:
        await claim(store, settings, "boot/mine", poll=0.05)
        claimed.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(claim_it)
        await anyio.sleep(1)
        assert not claimed.is_set()  # still waiting for the record to go
        await store.delete(keys.node("n1"))
        with anyio.fail_after(5):
            await claimed.wait()


class NewerNode(BaseModel):
    """A node record of a later version, with a field this one does not know."""

    name: str
    address: str
    later: str


async def test_a_record_it_cannot_read_is_another_agents_and_refuses_the_start(
    store: Store, tmp_path: Path
) -> None:
    """Another version's agent holds the node (its record does not parse here): waited out
    as any other agent's, then refused, saying so."""
    await store.put(keys.node("n1"), NewerNode(name="n1", address="10.0.0.9", later="x"))
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    started = anyio.current_time()
    with (
        anyio.fail_after(TTL + CLAIM_MARGIN + 10),
        pytest.raises(NodeTaken, match=r"still runs \(in a record this version cannot read;"),
    ):
        await claim(store, settings, "boot/mine", poll=0.1)
    assert anyio.current_time() - started >= TTL + CLAIM_MARGIN


async def test_the_agents_own_record_is_its_previous_run(store: Store, tmp_path: Path) -> None:
    """Killed, restarted at once on the same directory: its record still lives out its lease,
    and the directory's lock (free: the kernel released it) says no agent of it runs."""
    await store.put(keys.node("n1"), record("boot/mine"))
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    with anyio.fail_after(1):
        await claim(store, settings, "boot/mine")


async def test_a_store_down_while_it_claims_only_delays_the_claim(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant 19: etcd gone while the agent looks at its node's record (its own previous
    run's here) fails the read, which is tried again, each second, until etcd is back."""
    settings = agent_settings(tmp_path / "data", node_ttl=TTL)
    with EtcdServer() as etcd:
        store = EtcdStore([etcd.endpoint], namespace="/claim/", timeout=1.0)
        await store.connect()
        try:
            await store.put(keys.node("n1"), record("boot/mine"))
            etcd.stop()
            claimed = anyio.Event()

            async def claim_it() -> None:
                await claim(store, settings, "boot/mine")
                claimed.set()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(claim_it)
                with anyio.fail_after(20):
                    while "cannot read its record yet" not in caplog.text:  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                await anyio.sleep(1.5)  # a try or two more, while etcd is still away
                assert not claimed.is_set()
                await anyio.to_thread.run_sync(etcd.start)
                with anyio.fail_after(30):
                    await claimed.wait()
        finally:
            await store.aclose()


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


@pytest.mark.parametrize(
    ("holder", "waited", "step"),
    [
        (None, None, Claim.GO),
        ("boot/mine", None, Claim.GO),
        ("boot/mine", 100.0, Claim.GO),
        ("boot/other", None, Claim.WAIT),
        ("", None, Claim.WAIT),
        ("boot/other", TTL + CLAIM_MARGIN - 0.1, Claim.WAIT),
        ("boot/other", TTL + CLAIM_MARGIN, Claim.REFUSE),
    ],
    ids=[
        "nobody holds it",
        "its own record: its previous run",
        "its own, however long seen",
        "another agent's, just seen: wait",
        "an older agent's (no identity): wait as well",
        "not yet past its TTL and the margin: a previous run's lease may run out",
        "past it: another agent renews it",
    ],
)
def test_claim_step(holder: str | None, waited: float | None, step: Claim) -> None:
    assert claim_step(holder, "boot/mine", waited, TTL) is step
