"""Relay or wait: where a request for a tunnelled node's sandbox looks for a stream, as a pure
function of what this replica holds, what the node's record says its peers hold, and the time
left. No I/O, no clock reads, no awaits: `Tunnels.dial` gathers a `Seen`, asks `next_step`,
carries the step out, and asks again at the step's `then` when it found no stream.

The rules, in the order they are tried (all within `tunnel_wait`):

1. The node holds streams here: take the newest idle one, or wait `RELAY_AFTER` for a busy one
   to free. A stream here frees within a request's time, usually; a relay costs a connection
   to the peer, and relays both ways would take each other's streams.
2. Peers whose record shows idle streams of the node: ask each, most idle first, for one at
   once. A peer answers yes or no without waiting, so a stale record costs one round trip,
   never a wait behind another replica's queue.
3. Then wait for the rest of the time: here, if the node holds streams here (busy ones); else
   relayed to the peers holding any, most idle first, each waiting there.
4. Give up: the streams here stayed busy, or the peers' did (503), or the node holds no stream
   on any replica (it is unreachable: nothing reached the sandbox, so another may be tried).

A replica without an ingress token never relays.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

RELAY_AFTER = 0.05
"""Seconds a request waits for one of its node's busy streams here before it asks a peer."""

P = TypeVar("P")
"""A peer, as the caller knows it (its record); the decision only passes it on."""


class Stage(enum.Enum):
    """Where the search for a stream is: each step names the stage to go on at if it found
    none."""

    FIRST = "first"
    """Nothing tried yet."""
    ASK_IDLE_PEERS = "ask idle peers"
    """No stream here was free: ask the peers with idle ones, at once."""
    WAIT = "wait"
    """No peer gave one at once: wait for the rest of the time, here or at the peers."""
    BUSY_HERE = "busy here"
    """The wait here ran out."""
    BUSY_PEERS = "busy at the peers"
    """Every peer's wait ran out."""


class Why(enum.Enum):
    """Why a request gets no stream."""

    BUSY_HERE = "every stream of the node here stayed busy"
    BUSY_PEERS = "no replica holding a stream of the node had one free"
    UNREACHABLE = "the node holds no stream on any replica"


@dataclass(frozen=True, slots=True)
class Seen(Generic[P]):
    """What the replica sees of the node's streams as it decides."""

    here: int = 0
    """Streams of the node on this replica, idle or busy."""
    idle_here: int = 0
    """...of which idle."""
    peers: Sequence[tuple[P, int]] = ()
    """Peers where the node's record shows streams of it, each with how many of them are
    idle there (busy ones counted out: zero or less is none), most idle first."""
    left: float = 0.0
    """Seconds left of `tunnel_wait`."""
    can_relay: bool = True
    """This replica holds an ingress token to relay with."""


@dataclass(frozen=True, slots=True)
class TakeHere:
    """Take a stream of the node here, waiting up to `wait` seconds for one to free."""

    wait: float
    then: Stage


@dataclass(frozen=True, slots=True)
class Relay(Generic[P]):
    """Relay through each of `peers` in turn until one gives a stream; each may wait for
    the time left when `patient`, else answers at once."""

    peers: tuple[P, ...]
    patient: bool
    then: Stage


@dataclass(frozen=True, slots=True)
class GiveUp:
    why: Why


Step = TakeHere | Relay[P] | GiveUp


def next_step(stage: Stage, seen: Seen[P]) -> Step[P]:
    """The next place to look for a stream, from `stage` on (the rules above)."""
    if stage is Stage.FIRST:
        if seen.idle_here:
            return TakeHere(wait=0.0, then=Stage.ASK_IDLE_PEERS)
        if seen.here:
            return TakeHere(wait=RELAY_AFTER, then=Stage.ASK_IDLE_PEERS)
        stage = Stage.ASK_IDLE_PEERS
    if stage is Stage.ASK_IDLE_PEERS:
        idle_peers = tuple(peer for peer, idle in seen.peers if idle > 0)
        if idle_peers and seen.can_relay:
            return Relay(idle_peers, patient=False, then=Stage.WAIT)
        stage = Stage.WAIT
    if stage is Stage.WAIT:
        if seen.here:
            return TakeHere(wait=seen.left, then=Stage.BUSY_HERE)
        if not seen.peers:
            return GiveUp(Why.UNREACHABLE)
        if not seen.can_relay:
            return GiveUp(Why.BUSY_PEERS)
        return Relay(tuple(peer for peer, _ in seen.peers), patient=True, then=Stage.BUSY_PEERS)
    if stage is Stage.BUSY_HERE:
        return GiveUp(Why.BUSY_HERE)
    return GiveUp(Why.BUSY_PEERS)
