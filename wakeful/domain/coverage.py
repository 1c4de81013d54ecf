"""How many tunnel streams a node opens and closes each sizing tick, decided per ingress
replica (seed 003).

A node behind NAT dials out to the ingress tier and holds many streams, one call at a
time on each. The L7 balancer places each new stream on whichever replica it likes, and a
replica can hand a call for the node only to one of the node's idle streams on that same
replica. Sized as one total across replicas (`plan_total`, the incident of seed 003), the
replica receiving the calls could hold a single stream: one call in flight made it all busy,
its callers queued, idle streams sat on the other replicas, and the total said nothing was
short. `plan` sizes every replica on its own instead. It cannot say where a new stream lands,
so it opens greedily when a replica is short and prunes firmly at rest.

For each replica, with S its streams, B its busy ones (calls in flight) and the budget
B + reserve, the tick decides:

    covered    S >= budget                 nothing
    growing    short, B > 0                open max(grow_min, B, budget - S) this tick:
                                           doubling under pressure; not taken from the fill
                                           budget; paused while idle streams opened
                                           elsewhere since it went short reach
                                           idle_ceiling x (B + reserve); at most
                                           replica_cap - S
    filling    short, B == 0               open budget - S, from the fill budget
    overdue    short, B == 0, 30 s         filled like filling, or evacuated: its idle
                                           streams recycled so the balancer places them
                                           elsewhere -- never with calls in flight, only
                                           while another replica is covered, one per 30 s
    evacuated  for 10 minutes              idle streams recycled; no grow, no fill

While any replica is short the streams are held; once none is, idle streams at least
`prune_min_age` old and unused for `prune_unused` are closed, least recently used first,
down to each replica's budget. The caps close idle streams even below the reserve.

Decided here, where seed 003 leaves it open: an evacuated replica is not short (nothing is
held for it, so pruning goes on while one is evacuated); a replica is evacuated with every
idle stream it holds, and an evacuated one recycles its idle streams least recently used
first; a replica at `replica_cap` does not grow (whatever lands on it would be closed again);
under the node cap the fills are given up first, then the growth, then the reopening of
recycled streams. With the defaults `prune_min_age` never decides (a stream unused for 10
minutes is at least that old); it matters when `prune_unused` is set below it.

The pause counts only idle streams opened since the replica went short, against
idle_ceiling x (B + reserve): counting every idle stream elsewhere (the first version) let
the other replicas' reserves, or one unlucky first chunk, stop a busy replica's growth for a
whole burst -- in the incident's own layout, exactly as the total sizing did.

The budget counts calls in flight, not streams used recently: a replica hands each call to
its newest idle stream, so a count of recently used streams makes a quiet replica look short
and gets it evacuated (seed 003).

Pure: the caller passes the streams, the replicas it knows, what the last tick remembered and
the time, and applies the `Plan` (closes the listed streams, opens `open` new ones).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

GROW = "grow"
FILL = "fill"
EVACUATE = "evacuate"
RECYCLE = "recycle"
PRUNE = "prune"
CAP = "cap"


def _empty() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Stream:
    """One tunnel stream of the node, as the node sees it."""

    id: int
    replica: str
    """The ingress replica it landed on (from that replica's hello)."""
    busy: bool
    """Carrying a call now."""
    opened_at: float
    last_used: float
    """When its last call ended (`opened_at` if never used); ignored while busy."""


@dataclass(frozen=True, slots=True)
class Limits:
    reserve: int = 2
    """Idle streams every replica should hold beyond its calls in flight."""
    grow_min: int = 8
    """The fewest streams a growing replica opens in a tick."""
    node_cap: int = 2048
    """Streams this node holds in all."""
    replica_cap: int = 1024
    """Streams this node holds on one replica."""
    fill_per_tick: int = 4
    """The fill budget: streams opened per tick to fill (not to grow), over all replicas."""
    idle_ceiling: int = 4
    """Growth for a replica pauses while the idle streams on the other replicas (evacuated ones
    aside) opened since it went short are at least `idle_ceiling` x (its calls in flight +
    reserve)."""
    overdue_after: float = 30.0
    """Seconds a replica without calls stays short before it is overdue."""
    evacuate_every: float = 30.0
    """Seconds between two evacuations, at least."""
    evacuated_for: float = 600.0
    """Seconds a replica stays evacuated."""
    prune_min_age: float = 120.0
    """An idle stream younger than this is never pruned."""
    prune_unused: float = 600.0
    """An idle stream used within this many seconds is never pruned."""
    recycle_per_tick: int = 8
    """Idle streams of evacuated replicas recycled per tick, at most, over all of them."""


class State(enum.StrEnum):
    COVERED = "covered"
    GROWING = "growing"
    FILLING = "filling"
    OVERDUE = "overdue"
    EVACUATED = "evacuated"


SHORT = frozenset({State.GROWING, State.FILLING, State.OVERDUE})
"""The states of a replica holding fewer streams than its budget (evacuated ones aside)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """What one tick carries to the next; `Memory()` is the start."""

    short_since: Mapping[str, float] = field(default_factory=_empty)
    """Replica -> the start of its current run of short ticks."""
    evacuated_at: Mapping[str, float] = field(default_factory=_empty)
    """Replica -> when it was evacuated, for the last `evacuated_for` seconds."""
    last_evacuation: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica as this tick found it: streams, busy and budget before the plan."""

    replica: str
    streams: int
    busy: int
    budget: int
    state: State


@dataclass(frozen=True, slots=True)
class Plan:
    open: int
    """New streams to open this tick; the balancer places each."""
    close: tuple[int, ...]
    """Ids of idle streams to close now (recycled, pruned, over a cap); never a busy one."""
    replicas: tuple[ReplicaReport, ...]
    """One per known replica or replica holding streams, sorted by name."""
    actions: Mapping[str, int]
    """Streams per action this tick (`grow`, `fill`, `evacuate`, `recycle`, `prune`, `cap`),
    only the non-zero ones. `evacuate` and `recycle` count the streams closed to be opened
    again; `grow` and `fill` count the streams opened, after the node cap."""
    memory: Memory


@dataclass(slots=True)
class _Replica:
    name: str
    streams: list[Stream]
    busy: int

    @property
    def idle(self) -> int:
        return len(self.streams) - self.busy


def _lru(stream: Stream) -> tuple[float, int]:
    return (stream.last_used, stream.id)


class _Tick:
    """The closes and opens of one tick, as they are decided."""

    def __init__(self, streams: Sequence[Stream], known: Collection[str]) -> None:
        self.streams = streams
        groups: dict[str, list[Stream]] = {name: [] for name in known}
        for stream in streams:
            groups.setdefault(stream.replica, []).append(stream)
        self.replicas = {
            name: _Replica(name, groups[name], sum(1 for s in groups[name] if s.busy))
            for name in sorted(groups)
        }
        self.closed: dict[int, str] = {}
        """Stream id -> the action closing it, in the order decided."""
        self.opens: dict[str, int] = {}

    def close(self, stream: Stream, action: str) -> None:
        assert not stream.busy and stream.id not in self.closed
        self.closed[stream.id] = action

    def open(self, count: int, action: str) -> None:
        if count > 0:
            self.opens[action] = self.opens.get(action, 0) + count

    def idle_left(self, replica: _Replica) -> list[Stream]:
        """Its idle streams not closed yet, least recently used first."""
        return sorted(
            (s for s in replica.streams if not s.busy and s.id not in self.closed), key=_lru
        )

    def left(self, replica: _Replica) -> int:
        return sum(1 for s in replica.streams if s.id not in self.closed)

    def prune(self, limits: Limits, now: float, keep: Mapping[str, int]) -> None:
        """Close idle streams old and unused enough, least recently used first, while each
        replica named in `keep` holds more than its number there."""
        for name, floor in keep.items():
            replica = self.replicas[name]
            surplus = self.left(replica) - floor
            if surplus > 0:
                for stream in _oldest_prunable(replica.streams, self.closed, limits, now)[:surplus]:
                    self.close(stream, PRUNE)

    def caps(self, limits: Limits) -> int:
        """Close idle streams over the caps; the streams that may be opened this tick."""
        for replica in self.replicas.values():
            excess = self.left(replica) - limits.replica_cap
            if excess > 0:
                for stream in self.idle_left(replica)[:excess]:
                    self.close(stream, CAP)
        excess = len(self.streams) - len(self.closed) - limits.node_cap
        if excess > 0:
            idle = sorted(
                (s for s in self.streams if not s.busy and s.id not in self.closed), key=_lru
            )
            for stream in idle[:excess]:
                self.close(stream, CAP)
        return max(0, limits.node_cap - (len(self.streams) - len(self.closed)))

    def plan(self, states: Mapping[str, State], memory: Memory, limits: Limits, room: int) -> Plan:
        """The plan, opening at most `room`: what fills is given up first, then what grows,
        then what replaces a recycled stream."""
        recycled = self.opens.get(EVACUATE, 0) + self.opens.get(RECYCLE, 0)
        grow = min(self.opens.get(GROW, 0), max(0, room - recycled))
        fill = min(self.opens.get(FILL, 0), max(0, room - recycled - grow))
        actions: dict[str, int] = {}
        for action in self.closed.values():
            actions[action] = actions.get(action, 0) + 1
        actions[GROW] = grow
        actions[FILL] = fill
        return Plan(
            open=min(room, recycled + grow + fill),
            close=tuple(self.closed),
            replicas=tuple(
                ReplicaReport(
                    replica=r.name,
                    streams=len(r.streams),
                    busy=r.busy,
                    budget=r.busy + limits.reserve,
                    state=states[r.name],
                )
                for r in self.replicas.values()
            ),
            actions=MappingProxyType(
                {action: count for action, count in sorted(actions.items()) if count > 0}
            ),
            memory=memory,
        )


def _oldest_prunable(
    streams: Sequence[Stream], closed: Collection[int], limits: Limits, now: float
) -> list[Stream]:
    """The idle streams not closed yet that are old and unused enough to prune, least recently
    used first."""
    return sorted(
        (
            s
            for s in streams
            if not s.busy
            and s.id not in closed
            and now - s.opened_at >= limits.prune_min_age
            and now - s.last_used >= limits.prune_unused
        ),
        key=_lru,
    )


def plan(
    streams: Sequence[Stream],
    known: Collection[str],
    memory: Memory,
    now: float,
    limits: Limits = Limits(),
) -> Plan:
    """This tick's plan for each replica, sized on its own (the table in the module
    docstring)."""
    tick = _Tick(streams, known)
    if not tick.replicas:
        # Nothing to go on: open the reserve and let the hellos name the replicas.
        tick.open(limits.reserve, FILL)
        memory = Memory(last_evacuation=memory.last_evacuation)
        return tick.plan({}, memory, limits, tick.caps(limits))

    evacuated_at = {
        name: at
        for name, at in memory.evacuated_at.items()
        if name in tick.replicas and now - at < limits.evacuated_for
    }
    last_evacuation = memory.last_evacuation
    short_since: dict[str, float] = {}
    states: dict[str, State] = {}
    for name, r in tick.replicas.items():
        if name in evacuated_at:
            states[name] = State.EVACUATED
        elif len(r.streams) >= r.busy + limits.reserve:
            states[name] = State.COVERED
        else:
            short_since[name] = memory.short_since.get(name, now)
            if r.busy > 0:
                states[name] = State.GROWING
            elif now - short_since[name] >= limits.overdue_after:
                states[name] = State.OVERDUE
            else:
                states[name] = State.FILLING

    # Evacuated replicas: recycle their idle streams so the balancer places them again,
    # a few a tick; a busy one waits until it is idle (seed 003).
    recycle = limits.recycle_per_tick
    for name, r in tick.replicas.items():
        if states[name] is State.EVACUATED:
            for stream in tick.idle_left(r)[:recycle]:
                tick.close(stream, RECYCLE)
                recycle -= 1
    tick.open(limits.recycle_per_tick - recycle, RECYCLE)

    # Overdue: a replica the balancer stopped placing streams on, without calls. Evacuate it
    # (all its streams are idle) while another replica is covered, one per evacuate_every.
    covered = [name for name, state in states.items() if state is State.COVERED]
    for name, r in tick.replicas.items():
        if states[name] is not State.OVERDUE or not [c for c in covered if c != name]:
            continue
        if last_evacuation is not None and now - last_evacuation < limits.evacuate_every:
            break
        assert r.busy == 0
        for stream in tick.idle_left(r):
            tick.close(stream, EVACUATE)
        tick.open(len(r.streams), EVACUATE)
        states[name] = State.EVACUATED
        evacuated_at[name] = last_evacuation = now
        del short_since[name]

    # Growing: open a chunk now, not from the fill budget, unless what its growth already
    # opened sits idle elsewhere: idle streams on the other replicas opened since it went
    # short reach idle_ceiling x its demand (the balancer is not placing on it). Streams that
    # were there before do not count: reserves alone must not stop a replica from growing.
    for name, r in tick.replicas.items():
        if states[name] is not State.GROWING:
            continue
        since = short_since.get(name, now)
        elsewhere = sum(
            1
            for other in tick.replicas.values()
            if other.name != name and states[other.name] is not State.EVACUATED
            for stream in other.streams
            if not stream.busy and stream.opened_at >= since
        )
        if elsewhere >= limits.idle_ceiling * (r.busy + limits.reserve):
            continue
        chunk = max(limits.grow_min, r.busy, r.busy + limits.reserve - len(r.streams))
        tick.open(min(chunk, limits.replica_cap - len(r.streams)), GROW)

    # Filling and overdue (not evacuated): toward the reserve, from the fill budget.
    budget = limits.fill_per_tick
    for name, r in tick.replicas.items():
        if states[name] in (State.FILLING, State.OVERDUE):
            wanted = min(budget, r.busy + limits.reserve - len(r.streams))
            tick.open(wanted, FILL)
            budget -= wanted

    if not any(state in SHORT for state in states.values()):
        tick.prune(
            limits,
            now,
            {
                name: r.busy + limits.reserve
                for name, r in tick.replicas.items()
                if states[name] is not State.EVACUATED
            },
        )
    return tick.plan(
        states,
        Memory(
            short_since=MappingProxyType(short_since),
            evacuated_at=MappingProxyType(evacuated_at),
            last_evacuation=last_evacuation,
        ),
        limits,
        tick.caps(limits),
    )


def plan_total(
    streams: Sequence[Stream],
    known: Collection[str],
    memory: Memory,
    now: float,
    limits: Limits = Limits(),
) -> Plan:
    """The incident's sizing (seed 003), kept so tests can show the incident: one total across
    replicas. Short when all streams number fewer than all calls in flight + reserve, and then
    open max(grow_min, calls in flight, shortfall); never per replica, no fill budget, no
    evacuation; prune down to the total budget. Every replica reports the total's state,
    COVERED or GROWING; `memory` is returned as it came."""
    tick = _Tick(streams, known)
    if not tick.replicas:
        tick.open(limits.reserve, FILL)
        return tick.plan({}, memory, limits, tick.caps(limits))
    busy = sum(r.busy for r in tick.replicas.values())
    target = busy + limits.reserve
    if len(streams) < target:
        tick.open(max(limits.grow_min, busy, target - len(streams)), GROW)
        state = State.GROWING
    else:
        state = State.COVERED
        for stream in _oldest_prunable(streams, (), limits, now)[: len(streams) - target]:
            tick.close(stream, PRUNE)
    return tick.plan(dict.fromkeys(tick.replicas, state), memory, limits, tick.caps(limits))
