"""What the pool controller does to one pool, decided from a snapshot: pure, no I/O.

Rules:
- Sandboxes on a node that is gone (its TTL record expired) are dead.
- Dead and stopped sandboxes are removed; a draining one is stopped once it holds no leases.
- Too few live sandboxes (pending, booting, running): create records on live, uncordoned nodes
  with the fewest sandboxes -- unless the pool is in a crash cooldown.
- Too many: stop pending, then booting ones, then suspended ones (the longest suspended
  first: frozen, they hold no lease and serve nothing); then drain running ones, those holding
  no leases first, oldest activity first. A draining sandbox leaves admission at once and is
  stopped only when its last lease is gone, so no request is lost to a scale-down.
- A crash is a sandbox that died before it was ever ready; crashes in a row back off
  exponentially (capped); a routable sandbox ends the streak.
- A stateful app (`[state]`, one sandbox at most) has one writer: its sandbox is created only
  while its state belongs to no node, adopting it in the same write (`Create.adopt`). On an
  evacuating node it is moved, not replaced: gated (drained) when the reconciler's budget of
  moves has room for it, stopped once its leases end or `grace` has passed, and created again
  elsewhere once its node handed the state back. A state held by a node gone for longer than
  `Moves.lost` allows is taken back with its last archive (`lost_holders`: a new leader
  waits the whole time again, the safe way).
- A cordon record (`wakeful drain`) makes its node cordoned, and evacuating when it says so
  (`with_cordon`): the planner, the node API and the dashboard see one merged node.
- A sandbox created before its app's latest secrets change that restarts (`behind`: its
  `secrets_generation` below the app's `restart_generation`) is replaced as a sandbox on an
  evacuating node is, in every pool of the app that is not retired (a retired pool's
  sandboxes are going away anyway): one running (or suspended holding a lease) keeps serving
  until fresh ones elsewhere serve the pool's size, then it is drained; one not serving yet
  (pending, booting) or frozen with no lease is stopped at once and the size rule replaces
  it. A stateful app's sandbox is moved as off an evacuating node (drained, its state handed
  back, created anew), without waiting for the evacuation budget. Only while a replacement
  can be placed (a node takes new sandboxes, no crash cooldown): otherwise it stays as it
  is and keeps serving, so a pool never grows past twice its size waiting for room, and an
  app that crashes with its new secrets keeps the sandboxes that serve with the old ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wakeful.domain.models import (
    FINISHED,
    ON_NODE,
    SIZED,
    AppState,
    Cordon,
    Node,
    Pool,
    Sandbox,
    SandboxStatus,
)

COOLDOWN_BASE = 1.0
COOLDOWN_CAP = 60.0


@dataclass(frozen=True, slots=True)
class Create:
    node: str
    adopt: int | None = None
    """A stateful app's sandbox: adopt its state, free at this epoch, in the same write."""


@dataclass(frozen=True, slots=True)
class Drain:
    sandbox_id: str


@dataclass(frozen=True, slots=True)
class Stop:
    sandbox_id: str


@dataclass(frozen=True, slots=True)
class Remove:
    sandbox_id: str
    crashed: bool


@dataclass(frozen=True, slots=True)
class MarkDead:
    sandbox_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class TakeBack:
    """The node holding a stateful app's state is gone: release it with its last archive."""

    app: str
    node: str


Action = Create | Drain | Stop | Remove | MarkDead | TakeBack


@dataclass(frozen=True)
class Moves:
    """How the reconciler paces stateful sandboxes off evacuating nodes: `now`, the ids it
    lets move in this tick (within its budget); `grace`, seconds a stateful sandbox leaving
    service waits for its leases before it is stopped anyway (requests wait behind it)."""

    now: frozenset[str] = frozenset()
    grace: float = 30.0
    lost: frozenset[str] = frozenset()
    """Nodes gone long enough that the states they hold are taken back (a node that returns
    sooner hands back what its killed run left, with the app's latest writes)."""


MOVE_ORDER = {
    SandboxStatus.PENDING: 0,
    SandboxStatus.BOOTING: 1,
    SandboxStatus.SUSPENDED: 2,
    SandboxStatus.RUNNING: 3,
}
"""Which go first when a pool sheds or moves sandboxes: those serving nothing yet, then the
frozen ones, then those running."""


def choose_moves(
    stateful: Sequence[Sandbox], leased: Mapping[str, int], evacuating: set[str], budget: int
) -> frozenset[str]:
    """Which stateful sandboxes on evacuating nodes start moving now: at most `budget` more
    than are moving already (draining or stopping there), those not serving yet first, then
    those holding no lease, the least recently active first."""
    there = [s for s in stateful if s.node in evacuating]
    moving = sum(1 for s in there if s.status in (SandboxStatus.DRAINING, SandboxStatus.STOPPING))
    waiting = sorted(
        (s for s in there if s.status in MOVE_ORDER),
        key=lambda s: (MOVE_ORDER[s.status], leased.get(s.id, 0) > 0, s.last_activity, s.id),
    )
    return frozenset(s.id for s in waiting[: max(0, budget - moving)])


def crashed(sandbox: Sandbox) -> bool:
    """Died without ever becoming ready, as its node reported: the app failed to boot.

    A sandbox the controller declared dead (its node went away) had its ownership released
    in that write; that is not the app's fault and is not counted."""
    return (
        sandbox.status is SandboxStatus.DEAD
        and sandbox.address is None
        and not (sandbox.owner is None and sandbox.epoch > 0)
    )


def cooldown(crash_count: int) -> float:
    return min(COOLDOWN_BASE * 2.0 ** max(0, crash_count - 1), COOLDOWN_CAP)


def tally_crashes(
    pool: Pool, sandboxes: Sequence[Sandbox], now: float, restart_generation: int = 0
) -> Pool | None:
    """The pool record with its boot crashes counted, before their records are removed: the
    streak grows by each crashed sandbox, its cooldown starts again from `now`, and the last
    crash's log is kept. A routable sandbox ends a streak, unless it is `behind` the app's
    `restart_generation`: one still serving with the values a secrets change replaced says
    nothing of whether the new ones boot (the replacements crashing with them back off as a
    crashing deploy's do). None: nothing to write."""
    crashes = [s for s in sandboxes if crashed(s)]
    if crashes:
        count = pool.crash_count + len(crashes)
        return pool.model_copy(
            update={
                "crash_count": count,
                "crash_cooldown_until": now + cooldown(count),
                "last_crash_log": crashes[-1].last_log[-4000:],
            }
        )
    if pool.crash_count and any(
        s.routable and not behind(s, restart_generation) for s in sandboxes
    ):
        return pool.model_copy(update={"crash_count": 0, "crash_cooldown_until": 0.0})
    return None


def lost_holders(
    gone_since: Mapping[str, float], holders: set[str], live: set[str], now: float, after: float
) -> tuple[dict[str, float], frozenset[str]]:
    """The nodes holding a state that are gone (`holders` not `live`), each with when it was
    first seen gone (`gone_since`, from the last call, else `now`); and those of them gone
    `after` seconds or more, whose states are taken back (`Moves.lost`). A node seen live
    again starts from `now` when it goes next."""
    since = {node: gone_since.get(node, now) for node in holders - live}
    return since, frozenset(node for node, at in since.items() if now - at >= after)


def with_cordon(node: Node, cordon: Cordon | None) -> Node:
    """`node` as planned with: cordoned while a cordon names it, evacuating if that says so."""
    if cordon is None:
        return node
    return node.model_copy(update={"cordoned": True, "evacuating": cordon.evacuate})


def plan_pool(
    pool: Pool | None,
    sandboxes: Sequence[Sandbox],
    leased: Mapping[str, int],
    nodes: Sequence[Node],
    placed: dict[str, int],
    now: float,
    *,
    state: AppState | None = None,
    moves: Moves | None = None,
    restart_generation: int = 0,
) -> list[Action]:
    """Actions for one pool (None: the pool is gone, so everything of it goes).

    `placed` counts live sandboxes per node across all pools; creations update it. `state`:
    the app's state record when the pool's app is stateful; `moves`: how stateful sandboxes
    leave evacuating nodes; `restart_generation`: the app's (`AppSecrets`, 0 without one),
    which its sandboxes created from now on start at.
    """
    moves = moves or Moves()
    stateful = pool is not None and pool.spec.state is not None
    live_nodes = {n.name for n in nodes}
    evacuating = {n.name for n in nodes if n.evacuating}
    actions: list[Action] = []
    live: list[Sandbox] = []
    for sandbox in sandboxes:
        if sandbox.status in FINISHED:
            actions.append(Remove(sandbox.id, crashed(sandbox)))
        elif sandbox.node not in live_nodes:
            actions.append(MarkDead(sandbox.id, f"node {sandbox.node} is gone"))
        elif sandbox.owner is None and sandbox.epoch > 0:
            # Ownership was released and nobody took it: no node serves or reports it.
            actions.append(MarkDead(sandbox.id, "ownership released; nobody took it"))
        elif sandbox.status is SandboxStatus.DRAINING and (
            leased.get(sandbox.id, 0) == 0 or _gate_passed(sandbox, stateful, moves, now)
        ):
            actions.append(Stop(sandbox.id))
        elif sandbox.status in SIZED:
            live.append(sandbox)
    if stateful and state is not None and state.node in moves.lost - live_nodes:
        actions.append(TakeBack(state.app, state.node))
    desired = 0 if pool is None or pool.retired else pool.desired_instances
    candidates = [n for n in nodes if not n.cordoned and not n.evacuating and _reachable(n)]
    stale: set[str] = set()
    if pool is not None and not pool.retired and candidates and pool.crash_cooldown_until <= now:
        stale = {s.id for s in live if behind(s, restart_generation)}
    if stale and not stateful:
        # Serving nothing (not yet, or frozen with no lease): stopped now, the size rule
        # replaces it; what serves leaves as from an evacuating node, below.
        idle = [s for s in live if s.id in stale and not _serves(s, leased)]
        actions.extend(Stop(s.id) for s in idle)
        live = [s for s in live if s not in idle]
    # Sandboxes on an evacuating node, or behind, keep serving until replacements serve too.
    staying = [s for s in live if s.node not in evacuating and s.id not in stale]
    leaving = [s for s in live if s.node in evacuating or s.id in stale]
    if stateful:
        # One writer: moved (gated, stopped, created again elsewhere), never replaced first.
        if candidates:
            moving = [s for s in leaving if s.id in moves.now or s.id in stale]
            actions.extend(_shrink(moving, len(leaving), {}))
        leaving = []
    if len(staying) < desired:
        if pool is not None and pool.crash_cooldown_until > now:
            return actions
        adopt = None
        if stateful:
            held = state is not None and state.node is not None
            if held or any(s.status in ON_NODE for s in sandboxes):
                return actions  # its state comes free when the sandbox holding it stops
            adopt = 0 if state is None else state.epoch
        for _ in range(desired - len(staying)):
            if not candidates:
                break  # no adopter: what is on a leaving node stays and keeps serving
            node = min(candidates, key=lambda n: (placed.get(n.name, 0), n.name))
            placed[node.name] = placed.get(node.name, 0) + 1
            actions.append(Create(node.name, adopt))
    elif len(staying) > desired:
        actions.extend(_shrink(staying, len(staying) - desired, leased))
    serving = sum(1 for s in staying if s.routable or s.status is SandboxStatus.SUSPENDED)
    if leaving and serving >= desired:
        actions.extend(_shrink(leaving, len(leaving), leased))
    return actions


def behind(sandbox: Sandbox, restart_generation: int) -> bool:
    """Created before the app's latest secrets change that restarts: it started with values
    that changed since (or were unset), so it is replaced."""
    return sandbox.secrets_generation < restart_generation


def _serves(sandbox: Sandbox, leased: Mapping[str, int]) -> bool:
    """Running, or frozen holding a lease (adopted at a takeover; its node thaws it)."""
    return sandbox.status is SandboxStatus.RUNNING or (
        sandbox.status is SandboxStatus.SUSPENDED and leased.get(sandbox.id, 0) > 0
    )


def _gate_passed(sandbox: Sandbox, stateful: bool, moves: Moves, now: float) -> bool:
    """A stateful sandbox leaving service (moved, scaled down, replaced by a deploy) has waited
    `grace` for its leases: it stops anyway, since the next one cannot start before it."""
    return stateful and sandbox.draining_since > 0 and now - sandbox.draining_since >= moves.grace


def _shrink(live: list[Sandbox], excess: int, leased: Mapping[str, int]) -> list[Action]:
    ranked = sorted(
        live,
        key=lambda s: (
            MOVE_ORDER[s.status],
            leased.get(s.id, 0) > 0,
            s.suspended_at,
            s.last_activity,
            s.id,
        ),
    )
    actions: list[Action] = []
    for sandbox in ranked[:excess]:
        # A suspended sandbox holds no lease, unless one was adopted just now (a takeover):
        # then it is drained like a running one, and its node thaws it for those requests.
        busy = sandbox.status is SandboxStatus.SUSPENDED and leased.get(sandbox.id, 0) > 0
        if sandbox.status is SandboxStatus.RUNNING or busy:
            actions.append(Drain(sandbox.id))
        else:
            actions.append(Stop(sandbox.id))
    return actions


def _reachable(node: Node) -> bool:
    """A dial-out node takes new sandboxes only while it holds a tunnel stream somewhere:
    one nobody can reach would only make requests wait for it (seed 003)."""
    return node.tunnel is None or node.tunnel.reachable
