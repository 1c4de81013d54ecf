"""What the pool controller does to one pool, decided from a snapshot: pure, no I/O.

Rules:
- Sandboxes on a node that is gone (its TTL record expired) are dead.
- Dead and stopped sandboxes are removed; a draining one is stopped once it holds no leases.
- Too few live sandboxes (pending, booting, running): create records on live, uncordoned nodes
  with the fewest sandboxes -- unless the pool is in a crash cooldown.
- Too many: stop pending, then booting ones; then drain running ones, those holding no leases
  first, oldest activity first. A draining sandbox leaves admission at once and is stopped only
  when its last lease is gone, so no request is lost to a scale-down.
- A crash is a sandbox that died before it was ever ready; crashes in a row back off
  exponentially (capped); a routable sandbox ends the streak.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wakeful.domain.models import FINISHED, SIZED, Node, Pool, Sandbox, SandboxStatus

COOLDOWN_BASE = 1.0
COOLDOWN_CAP = 60.0


@dataclass(frozen=True, slots=True)
class Create:
    node: str


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


Action = Create | Drain | Stop | Remove | MarkDead


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


def plan_pool(
    pool: Pool | None,
    sandboxes: Sequence[Sandbox],
    leased: Mapping[str, int],
    nodes: Sequence[Node],
    placed: dict[str, int],
    now: float,
) -> list[Action]:
    """Actions for one pool (None: the pool is gone, so everything of it goes).

    `placed` counts live sandboxes per node across all pools; creations update it.
    """
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
        elif sandbox.status is SandboxStatus.DRAINING and leased.get(sandbox.id, 0) == 0:
            actions.append(Stop(sandbox.id))
        elif sandbox.status in SIZED:
            live.append(sandbox)
    desired = 0 if pool is None or pool.retired else pool.desired_instances
    # Sandboxes on an evacuating node keep serving until replacements elsewhere serve too.
    staying = [s for s in live if s.node not in evacuating]
    leaving = [s for s in live if s.node in evacuating]
    if len(staying) < desired:
        if pool is not None and pool.crash_cooldown_until > now:
            return actions
        candidates = [n for n in nodes if not n.cordoned and not n.evacuating]
        for _ in range(desired - len(staying)):
            if not candidates:
                break  # no adopter: what is on a leaving node stays and keeps serving
            node = min(candidates, key=lambda n: (placed.get(n.name, 0), n.name))
            placed[node.name] = placed.get(node.name, 0) + 1
            actions.append(Create(node.name))
    elif len(staying) > desired:
        actions.extend(_shrink(staying, len(staying) - desired, leased))
    if leaving and sum(1 for s in staying if s.routable) >= desired:
        actions.extend(_shrink(leaving, len(leaving), leased))
    return actions


def _shrink(live: list[Sandbox], excess: int, leased: Mapping[str, int]) -> list[Action]:
    order = {SandboxStatus.PENDING: 0, SandboxStatus.BOOTING: 1, SandboxStatus.RUNNING: 2}
    ranked = sorted(
        live,
        key=lambda s: (order[s.status], leased.get(s.id, 0) > 0, s.last_activity, s.id),
    )
    actions: list[Action] = []
    for sandbox in ranked[:excess]:
        if sandbox.status is SandboxStatus.RUNNING:
            actions.append(Drain(sandbox.id))
        else:
            actions.append(Stop(sandbox.id))
    return actions
