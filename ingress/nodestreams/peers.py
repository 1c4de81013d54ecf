"""What a replica knows of the other replicas and of the nodes' streams: the replicas' own
records (`ingresses/{replica}`: where each takes relays), the nodes' coverage tables
(`nodes/{node}`: how many streams, and how many busy, each node holds on each replica), both
followed by reflectors, and the record this replica keeps of itself, bound to a TTL lease so
it vanishes with the replica. A replica dials only addresses from these replica records, never
one a node wrote."""

from __future__ import annotations

import logging
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from wakeful.domain import keys
from wakeful.domain.models import IngressReplica, Node
from wakeful.store import Item, Store
from wakeful.store.held import (
    CLAIM_MARGIN,
    UNREADABLE,
    HeldRecord,
    HolderRunning,
    Taken,
    claim,
)
from wakeful.store.reflector import Feed

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class _Records(Generic[M]):
    """A reflector view of one prefix: the records by name."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.items: dict[str, M] = {}

    def replace(self, items: list[Item[M]], revision: int) -> None:
        self.items = {keys.name_in(item.key, self.prefix): item.value for item in items}

    def put(self, item: Item[M]) -> None:
        self.items[keys.name_in(item.key, self.prefix)] = item.value

    def delete(self, key: str, revision: int) -> None:
        self.items.pop(keys.name_in(key, self.prefix), None)


class Peers:
    """The other replicas (`ingresses/`) and where each node's streams are (`nodes/`)."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.replicas: _Records[IngressReplica] = _Records(keys.INGRESSES)
        self.nodes: _Records[Node] = _Records(keys.NODES)

    def feeds(self) -> list[Feed[Any]]:
        return [
            Feed(keys.INGRESSES, IngressReplica, self.replicas),
            Feed(keys.NODES, Node, self.nodes),
        ]

    def known(self) -> list[str]:
        return sorted({self.replica, *self.replicas.items})

    def holding(self, node: str, *, idle_only: bool) -> list[IngressReplica]:
        """Peers where `node` holds streams (with idle ones, if asked), most idle first."""
        return [peer for peer, idle in self.ranked(node) if idle > 0 or not idle_only]

    def ranked(self, node: str) -> list[tuple[IngressReplica, int]]:
        """Peers where `node` holds streams, each with how many of them are idle (streams less
        busy ones, as the node's record says: it may be a few seconds old), most idle first."""
        record = self.nodes.items.get(node)
        if record is None or record.tunnel is None:
            return []
        found = []
        for coverage in record.tunnel.replicas:
            peer = self.replicas.items.get(coverage.replica)
            if coverage.replica == self.replica or peer is None or coverage.streams == 0:
                continue
            found.append((peer, coverage.streams - coverage.busy))
        found.sort(key=lambda pair: -pair[1])
        return found


def ours(record: IngressReplica, mine: IngressReplica) -> bool:
    """`record` (found under this replica's name) is this replica's, or its previous run's:
    it takes relays at the same address, which this process now listens on (a replica of the
    same name elsewhere relays at another)."""
    return record.relay == mine.relay


def _relay(found: object) -> str:
    """Where another replica's record says it relays; it may be another version's."""
    return found.relay if isinstance(found, IngressReplica) else f"an address {UNREADABLE}"


def _twin(name: str, relay: str, lapsed: bool = False) -> str:
    how = (
        f"relays at {relay} now: this one's record lapsed (the store out of reach) and the "
        "other took it"
        if lapsed
        else f"still runs, relaying at {relay}"
    )
    return (
        f"ingress replica {name!r} is registered by another ingress that {how}: two replicas "
        "of one name would take each other's tunnels and relays; give this one a name of its "
        "own (WAKEFUL_TUNNEL_REPLICA) or stop the other"
    )


async def claim_name(store: Store, record: IngressReplica, ttl: int) -> None:
    """Before this replica takes tunnels: a record of its name that is not its own (another
    relay address) is a previous run's, gone within its TTL, or a running twin's, and the
    start is refused once it has stayed past the TTL and the margin (`HolderRunning`)."""

    def waiting(found: IngressReplica | None) -> None:
        log.warning(
            "ingress replica %s is registered by another ingress (relaying at %s): waiting "
            "up to %.0f s for that record to go (a previous run's) before taking tunnels",
            record.name,
            _relay(found),
            ttl + CLAIM_MARGIN,
        )

    await claim(
        store,
        keys.ingress(record.name),
        IngressReplica,
        identity=lambda found: found.relay,
        mine=record.relay,
        ttl=ttl,
        waiting=waiting,
        refused=lambda found: HolderRunning(_twin(record.name, _relay(found))),
        what=f"ingress replica {record.name}",
    )


async def hold_record(store: Store, record: IngressReplica, ttl: int) -> None:
    """Keep `record` (this replica's) in the store under a lease of `ttl` seconds, granted
    again when it expires; until cancelled, then revoked at once (at most 2 s), so no peer
    relays here any more. Alone under its name: a write under a new lease goes over no
    record or this replica's own (`ours`), else the run ends (`HolderRunning`)."""
    held = HeldRecord(
        store,
        keys.ingress(record.name),
        record,
        ttl=ttl,
        what=f"ingress replica {record.name}",
        claimable=lambda found: ours(found, record),
    )
    try:
        await held.run()
    except Taken as exc:
        relay = _relay(exc.holder)
        lapsed = held.held.is_set()  # else it started as this one did, and wrote first
        raise HolderRunning(_twin(record.name, relay, lapsed)) from None
    finally:
        await held.release(within=2)
