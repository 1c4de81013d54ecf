"""The node's record: `nodes/{node}`, bound to a TTL lease the agent keeps alive, so that it
is gone when the agent is (the pool controller then treats the node's sandboxes as dead), and
`seen/{node}`, written the first time the node registers (no TTL).

Two writers change the record, the suspended tier's report and the tunnel's coverage table;
one at a time, so no older copy lands after a newer one.

One agent is one node. A second agent of the same node would take the first one's sandboxes
for a previous run's and bury them (and clear their directories, on the same data directory),
so a node process starts its agent only once it holds its data directory's lock
(`held_data_dir`, released by the kernel however the process ends) and no other agent holds
its name (`claim`), before anything else touches the machine or the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import anyio

from wakeful.domain import keys
from wakeful.domain.models import Node, SeenNode, Tunnel
from wakeful.store import Conflict, Store
from wakeful.store.held import CLAIM_MARGIN, HeldRecord, Taken
from wakeful.store.held import claim as claim_record

from .settings import NodeSettings

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class NodeTaken(RuntimeError):
    """Another agent runs as this node, or on this data directory."""


@contextlib.contextmanager
def held_data_dir(data_dir: Path) -> Iterator[str]:
    """An exclusive lock on `data_dir`'s `agent.lock` while the block runs: a second agent on
    one data directory is refused (`NodeTaken`). The kernel releases it when the process ends,
    however it ends, so a restart after a crash takes it at once. Yields the agent's identity
    (`agent_identity`)."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = os.open(data_dir / "agent.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NodeTaken(
                f"another node agent (a `wakeful node`, or a `wakeful up`) runs on the data "
                f"directory {data_dir}: one agent a directory"
            ) from None
        yield agent_identity(data_dir)
    finally:
        os.close(lock)


def agent_identity(data_dir: Path, boot: Path = BOOT_ID) -> str:
    """`BOOT/DEVICE:INODE/ID`: the machine's boot (the kernel's id of it), the data
    directory's place on its file system, and a random id kept in it (made the first time).
    A run after a crash on the same machine and directory has the same; another directory, a
    copy of this one (`cp -a`, a volume snapshot) or a clone of the machine has another."""
    kept = data_dir / "agent.id"
    try:
        own = kept.read_text().strip()
    except FileNotFoundError:
        own = ""
    if not own:
        own = secrets.token_hex(8)
        kept.write_text(own + "\n")
    try:
        booted = boot.read_text().strip()[:8]
    except OSError:
        booted = "-"
    place = data_dir.stat()
    return f"{booted}/{place.st_dev}:{place.st_ino}/{own}"


def _holder(record: Node | None) -> str:
    """Which agent holds a node's record, as the claim's lines say it."""
    if record is None:
        return "in a record this version cannot read"
    return f"{record.agent or 'an older one'}, at {record.address}"


async def claim(store: Store, settings: NodeSettings, agent: str, poll: float = 0.5) -> None:
    """Before an agent writes anything: a record of its node held by another agent (another
    `agent_identity`) is a previous run's, whose lease runs out within its TTL, or another
    agent's, still running, which renews it. Waits for it to go; `NodeTaken` once it has
    stayed for the TTL and `CLAIM_MARGIN` (`wakeful.store.held.claim`). The agent's own
    record (this directory, this boot) is its previous run's: the data directory's lock says
    none of it runs."""
    name, ttl = settings.node_name, settings.node_ttl

    def waiting(record: Node | None) -> None:
        log.warning(
            "node %s is registered by another agent (%s): waiting up to %.0f s for that "
            "record to go (a previous run's) before starting",
            name,
            _holder(record),
            ttl + CLAIM_MARGIN,
        )

    def refused(record: Node | None) -> NodeTaken:
        return NodeTaken(
            f"node {name!r} is registered by another agent that still runs "
            f"({_holder(record)}; its record outlived its {ttl} s TTL): two agents of one "
            "node would each bury the other's sandboxes; give this one a name of its own "
            "(WAKEFUL_NODE_NAME) or stop the other"
        )

    await claim_record(
        store,
        keys.node(name),
        Node,
        identity=lambda record: record.agent,
        mine=agent,
        ttl=ttl,
        waiting=waiting,
        refused=refused,
        what=f"node {name}",
        poll=poll,
    )


class Registration:
    def __init__(
        self,
        store: Store,
        settings: NodeSettings,
        isolation: str,
        clock: Callable[[], float],
        agent: str = "",
    ) -> None:
        """`isolation`: how this node isolates sandboxes, as `wakeful status` shows it;
        `agent`: the agent's identity (`agent_identity`)."""
        self._store = store
        self._name = settings.node_name
        self._clock = clock
        self._lock = anyio.Lock()
        self._record = Node(
            name=settings.node_name,
            address=settings.node_address,
            capacity=settings.capacity,
            isolation=isolation,
            tunnel=Tunnel() if settings.tunnel else None,
            agent=agent,
        )
        self._held = HeldRecord(
            store,
            keys.node(settings.node_name),
            self._record,
            ttl=settings.node_ttl,
            what=f"node {settings.node_name}",
            after_write=self._seen,
            claimable=lambda record: record.agent == agent,
        )
        self.taken = False
        """Another agent's record was found where this one's was to go (`run` raised): the
        node is the other's, and this agent must not cordon it on its way out."""

    @property
    def held(self) -> anyio.Event:
        """Set once the record was first written (and `seen/{node}` was)."""
        return self._held.held

    async def run(self) -> None:
        """Write the record and keep it alive until cancelled (`HeldRecord.run`). The record
        goes only where no other agent's is, compare-and-set (`claimable`): `claim` lets two
        agents through that look at the same moment, and this stops the second. `NodeTaken`
        when another agent's record is there."""
        try:
            await self._held.run()
        except Taken as exc:
            self.taken = True
            holder = exc.holder
            where = f" (at {holder.address})" if isinstance(holder, Node) else ""
            if self._held.held.is_set():  # it ran: its record lapsed, and another took it
                raise NodeTaken(
                    f"node {self._name!r} is registered by another agent{where} now: this "
                    "one's record lapsed (the store out of reach for longer than its TTL?) "
                    "and the other took the node, so this one stops, and its sandboxes with it"
                ) from None
            raise NodeTaken(
                f"node {self._name!r} was registered by another agent{where} as this one "
                "started: two agents of one node would each bury the other's sandboxes; give "
                "this one a name of its own (WAKEFUL_NODE_NAME) or stop the other"
            ) from None

    async def release(self, within: float) -> None:
        """Delete the record now, not a TTL later (the agent stops)."""
        await self._held.release(within)

    async def _seen(self) -> None:
        with contextlib.suppress(Conflict):  # present from an earlier registration
            await self._store.create(
                keys.seen(self._name), SeenNode(name=self._name, first_seen=self._clock())
            )

    async def update(self, fields: Mapping[str, object]) -> None:
        """Rewrite the record with `fields` changed, if that changes it. Kept only once
        written: a write that failed (`StoreError`) is tried again by the next call."""
        async with self._lock:
            record = self._record.model_copy(update=dict(fields))
            if record != self._record:
                await self._held.put(record)
                self._record = record

    async def publish_tunnel(self, table: Tunnel) -> None:
        """Rewrite the record with the tunnel's coverage table (kept even when the write
        fails: the next write, or the next lease, carries it)."""
        async with self._lock:
            self._record = self._record.model_copy(update={"tunnel": table})
            await self._held.put(self._record)
