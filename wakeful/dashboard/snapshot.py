"""What the dashboard shows, as one JSON-ready snapshot, and the scale events it keeps.

Built from what the control plane's process already holds, without a store read: the
activator's view and ledger (pools, apps, traffic, wakes), the pool controller's mirror
(sandboxes, nodes, cordons) and the rollouts `live.py` lists now and then. No awaits: a
snapshot is built in one step of the event loop, so it is consistent with itself. Its size is
bounded (`MAX_APPS`, `MAX_SANDBOXES`; the totals say how many there are), as it costs the event
loop time in proportion, every second someone watches.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wakeful.activator.core import Activator, PoolSnapshot, WakeTally
from wakeful.controller.mirror import Mirror
from wakeful.controller.plan import with_cordon
from wakeful.domain.models import App, CertRecord, CertState, Pool, RolloutRecord

MAX_APPS = 100
"""Apps in one snapshot, busiest first (the count says how many there are): a snapshot costs
the control plane's event loop time in proportion, every second someone watches."""
MAX_SANDBOXES = 500
"""Sandboxes listed in one snapshot (the count says how many there are)."""


def build(
    now: float,
    activator: Activator,
    mirror: Mirror | None,
    seen: Iterable[str],
    rollouts: Sequence[RolloutRecord],
    events: Iterable[dict[str, Any]],
    certs: Iterable[CertRecord] = (),
) -> dict[str, Any]:
    """The snapshot at `now`. `mirror`: None before the pool controller's first listing (no
    sandboxes or nodes then); `seen`: every node that ever registered; `events`: the scale
    events, newest first; `certs`: the certificates from ACME, shown with their apps."""
    pools = activator.snapshot()
    known = activator.apps()
    apps = _apps(now, activator, known, pools, certs_by_app(certs))
    sandboxes: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    total = 0
    if mirror is not None:
        total = len(mirror.sandboxes.items)
        sandboxes = _sandboxes(mirror)
        nodes = _nodes(mirror, seen)
    ready = {p.pool: p.ready for p in pools}
    return {
        "at": now,
        "apps": apps,
        "apps_total": len(known),
        "sandboxes": sandboxes,
        "sandboxes_total": total,
        "events": list(events),
        "rollouts": [_rollout(r, ready) for r in rollouts],
        "nodes": nodes,
    }


def scale_events(
    pools: Iterable[Pool], recorded: Mapping[str, float]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The scale events not recorded yet, oldest first: each pool's `last_scale`, once (it is
    written in the same compare-and-set as the size). `recorded`: per pool, the `last_scale.at`
    recorded already; returned with these added and the pools that are gone forgotten."""
    pools = list(pools)
    now_recorded = {p.name: recorded[p.name] for p in pools if p.name in recorded}
    fresh: list[dict[str, Any]] = []
    for pool in pools:
        change = pool.last_scale
        if change is None or now_recorded.get(pool.name) == change.at:
            continue
        now_recorded[pool.name] = change.at
        fresh.append(
            {
                "at": change.at,
                "app": pool.app,
                "pool": pool.name,
                "kind": "scale_up" if change.to_instances > change.from_instances else "scale_down",
                "from": change.from_instances,
                "to": change.to_instances,
                "reason": change.reason,
            }
        )
    return sorted(fresh, key=lambda e: float(e["at"])), now_recorded


def certs_by_app(certs: Iterable[CertRecord]) -> dict[str, list[dict[str, Any]]]:
    """Each app's certificates from ACME as the page shows them: name, state, expiry, the
    last error while failing (never a key)."""
    by_app: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in sorted(certs, key=lambda r: r.name):
        if record.app is None:
            continue
        by_app[record.app].append(
            {
                "name": record.name,
                "state": record.state.value,
                "not_after": record.issued.not_after if record.issued else None,
                "error": record.last_error if record.state is CertState.FAILING else "",
            }
        )
    return dict(by_app)


def _apps(
    now: float,
    activator: Activator,
    known: list[App],
    pools: list[PoolSnapshot],
    certs: dict[str, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The busiest apps first (any live sandbox, waiter or desired instance), then by name."""
    by_app: dict[str, list[PoolSnapshot]] = collections.defaultdict(list)
    for counted in pools:
        by_app[counted.app].append(counted)

    def busy(record: App) -> tuple[bool, str]:
        mine = by_app.get(record.name, ())
        return (not any(p.live or p.waiters or p.desired_instances for p in mine), record.name)

    apps = []
    for record in sorted(known, key=busy)[:MAX_APPS]:
        mine = sorted(
            by_app.get(record.name, ()),
            key=lambda p: (p.version != record.active_version, p.pool),
        )
        apps.append(
            {
                "app": record.name,
                "version": record.active_version,
                "split": dict(record.split),
                "tags": dict(record.tags),
                "hosts": list(record.hosts),
                "certs": certs.get(record.name, []),
                "pools": [
                    {
                        "pool": p.pool,
                        "version": p.version,
                        "state": p.state,
                        "desired": p.desired_instances,
                        "live": p.live,
                        "ready": p.ready,
                        "suspended": p.suspended,
                        "leased": p.leased,
                        "overflow": p.overflow,
                        "waiters": p.waiters,
                    }
                    for p in mine
                ],
                "series": activator.traffic.series(record.name, now),
                "wakes": _wakes(activator.wakes(record.name)),
            }
        )
    return apps


def _sandboxes(mirror: Mirror) -> list[dict[str, Any]]:
    records = sorted(
        (i.value for i in mirror.sandboxes.items.values()),
        key=lambda s: (s.node or "", s.app, s.id),
    )
    return [
        {
            "id": sandbox.id,
            "app": sandbox.app,
            "pool": sandbox.pool,
            "node": sandbox.node,
            "status": sandbox.status.value,
            "ready": sandbox.ready,
            "created_at": sandbox.created_at or None,
        }
        for sandbox in records[:MAX_SANDBOXES]
    ]


def _nodes(mirror: Mirror, seen: Iterable[str]) -> list[dict[str, Any]]:
    """Every node registered now or ever (`seen`), cordoned as its cordon says."""
    per_node = collections.Counter(
        i.value.node for i in mirror.sandboxes.items.values() if i.value.node
    )
    cordons = {i.value.node: i.value for i in mirror.cordons.items.values()}
    registered = {}
    for item in mirror.nodes.items.values():
        node = with_cordon(item.value, cordons.get(item.value.name))
        registered[node.name] = node
    nodes = []
    for name in sorted(set(registered) | set(seen)):
        found = registered.get(name)
        cordon = cordons.get(name)
        nodes.append(
            {
                "name": name,
                "registered": found is not None,
                "cordoned": found.cordoned if found else cordon is not None,
                "evacuating": (found.evacuating if found else bool(cordon and cordon.evacuate)),
                "sandboxes": per_node.get(name, 0),
                "reachable": found.tunnel.reachable if found and found.tunnel else None,
            }
        )
    return nodes


def _rollout(record: RolloutRecord, ready: Mapping[str, int]) -> dict[str, Any]:
    return {
        "app": record.app,
        "version": record.version,
        "phase": record.phase,
        "ready": ready.get(record.pool, 0),
        "target_ready": record.target_ready,
        "message": record.message[:500],
        "started_at": record.started_at,
    }


def _wakes(tally: WakeTally | None) -> dict[str, Any] | None:
    """How an app's waiting requests woke it: by `thaw` of a suspended sandbox or `start`."""
    if tally is None:
        return None
    return {
        "thaw": tally.thaw,
        "start": tally.start,
        "last_kind": tally.last_kind,
        "last_ms": round(tally.last_seconds * 1000, 1),
        "last_at": tally.last_at,
    }
