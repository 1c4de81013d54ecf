"""How the CLI shows what the control API answers: pure functions from its JSON to lines."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from wakeful.domain.shown import shown

POOL_COLUMNS = [
    ("pool", "POOL"),
    ("app", "APP"),
    ("version", "VERSION"),
    ("state", "STATE"),
    ("desired_instances", "DESIRED"),
    ("live", "LIVE"),
    ("ready", "READY"),
    ("suspended", "SUSPENDED"),
    ("leased", "LEASED"),
    ("overflow", "OVERFLOW"),
    ("waiters", "WAITERS"),
    ("crashes", "CRASHES"),
]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, each as wide as its widest cell."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in [headers, *rows]
    ]


def pool_table(pools: Sequence[Mapping[str, Any]]) -> list[str]:
    # A retired pool's size is nobody's target: show its state, not a number.
    rows = [
        [
            "-" if key == "desired_instances" and p["state"] != "active" else str(p.get(key, 0))
            for key, _ in POOL_COLUMNS
        ]
        for p in pools
    ]
    return table([header for _, header in POOL_COLUMNS], rows)


def app_line(app: Mapping[str, Any]) -> str:
    line = f"{app['name']}  active={app['active_version']}  versions={','.join(app['versions'])}"
    split = app.get("split") or {}
    if split:
        line += "  split=" + ",".join(f"{v}:{share}" for v, share in split.items())
    tags = app.get("tags") or {}
    if tags:
        line += "  tags=" + ",".join(f"{t}:{v}" for t, v in sorted(tags.items()))
    return line


def version_lines(app: Mapping[str, Any]) -> list[str]:
    """The active version marked `*`, how it was made, and the image it runs, pinned
    (`REF@sha256:...`)."""
    images = app.get("images") or {}
    made = app.get("made") or {}
    return [
        f"{'*' if version == app['active_version'] else ' '} {version}"
        + (f"  {made[version]}" if version in made else "")
        + (f"  {images[version]}" if version in images else "")
        for version in app["versions"]
    ]


def node_line(node: Mapping[str, Any]) -> str:
    state = "evacuating" if node["evacuating"] else "cordoned" if node["cordoned"] else "ready"
    if not node["registered"]:  # listed for its cordon: its agent's as it stopped, or a drain's
        state = "not running" + ("" if state == "ready" else f", {state}")
    isolation = node.get("isolation") or "unknown"
    moving = node.get("progress")
    counts = "" if not moving else f"  {progress_counts(moving)}"
    line = f"{node['name']}  {state}  sandboxes={node['sandboxes']}{counts}  isolation: {isolation}"
    cache = node.get("image_cache")
    if cache:
        line += (
            f"\n  images: {cache['images']} unpacked, {_mib(cache['bytes'])} of "
            f"{_mib(cache['bound'])}; {cache['hits']} hits, {cache['misses']} misses"
        )
    if node.get("suspended"):
        held, cap = node.get("suspended_memory", 0), node.get("suspended_memory_cap", 0)
        line += f"\n  suspended: {node['suspended']} holding {_mib(held)} of {_mib(cap)}"
        if node.get("evict_bytes"):
            listed = [frozen["sandbox"] for frozen in node.get("evict") or []]
            first = ", ".join(listed[:3]) + (
                f", +{len(listed) - 3} more" if len(listed) > 3 else ""
            )
            wanted = node["evict_bytes"]
            asked = _mib(wanted) if wanted >= 1 << 20 else "less than 1 MiB"
            why = "; memory pressure: one more each pass" if node.get("memory_pressure") else ""
            line += f" (asks to give up {asked}{why}; longest suspended first: {first})"
    for kept in node.get("kept") or []:  # a reason can quote the app's state: one line
        line += f"\n  keeps the state of {kept['app']}, not handed back: {shown(kept['reason'])}"
    tunnel = node.get("tunnel")
    if tunnel is not None:
        reach = "reachable" if tunnel.get("reachable") else "UNREACHABLE: no stream on any replica"
        line += f"\n  tunnel: {reach} (since {_when(tunnel.get('since'))})"
        for replica in tunnel.get("replicas") or []:
            line += (
                f"\n    replica {replica['replica']}: streams={replica['streams']} "
                f"busy={replica['busy']} budget={replica['budget']} {replica['state']}"
            )
    return line


PROGRESS = ("owned", "running", "moving", "archived", "moved", "failed")


def progress_counts(progress: Mapping[str, Any]) -> str:
    """`owned=3 running=2 moving=1 archived=0 moved=4 failed=0`: a drain's progress."""
    return " ".join(f"{name}={progress.get(name, 0)}" for name in PROGRESS)


def deletion_line(app: str, report: Mapping[str, Any]) -> str:
    return (
        f"deleted {app}: {report['versions']} version(s), "
        f"{report['artifacts_removed']} artifact(s); its sandboxes finish their requests and stop"
    )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def secret_table(listing: Mapping[str, Any]) -> list[str]:
    """Name, when set, by which token, under which key: what `GET /v1/apps/{app}/secrets`
    lists (never a value)."""
    rows = [[e["name"], _when(e["set_at"]), e["set_by"], e["key_id"]] for e in listing["secrets"]]
    return table(["NAME", "SET", "BY", "KEY"], rows)


def registry_table(logins: Sequence[Mapping[str, Any]]) -> list[str]:
    """Host, user, when set, by which token, under which key: what `GET /v1/registries`
    lists (never a password)."""
    rows = [
        [e["host"], e["username"], _when(e["set_at"]), e["set_by"], e["key_id"]] for e in logins
    ]
    return table(["HOST", "USER", "SET", "BY", "KEY"], rows)


def _when(stamp: float | None) -> str:
    return "-" if not stamp else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def token_table(tokens: Sequence[Mapping[str, Any]]) -> list[str]:
    """Name, role, when made and rotated, id: what the control API lists (never a secret)."""
    rows = [
        [t["name"], t["role"], _when(t["created_at"]), _when(t["rotated_at"]), t["id"]]
        for t in tokens
    ]
    return table(["NAME", "ROLE", "CREATED", "ROTATED", "ID"], rows)


def cert_table(certs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each name's certificate from ACME: state, issuer, expiry, next attempt, last error."""
    rows = []
    for c in certs:
        expires = _when(c["not_after"]) if c["not_after"] else "-"
        retry = _when(c["next_attempt"]) if c["state"] == "failing" else "-"
        issuer = c["issuer"] or "-"
        app = c.get("app") or "-"
        error = c["last_error"] or "-"
        rows.append([c["name"], app, c["source"], c["state"], issuer, expires, retry, error])
    headers = ["NAME", "APP", "SOURCE", "STATE", "ISSUER", "EXPIRES", "NEXT ATTEMPT"]
    return table([*headers, "LAST ERROR"], rows)


def traffic_table(report: Mapping[str, Any]) -> list[str]:
    """Each version the app routes: its share, whether it is the active one, its tags, and
    while it has a split or tags, each version's figures over the report's window."""
    split: Mapping[str, int] = report["split"]
    active = report["active_version"]
    figures: Mapping[str, Mapping[str, Any]] = report.get("figures") or {}
    tags: dict[str, list[str]] = {}
    for tag, version in report["tags"].items():
        tags.setdefault(version, []).append(tag)
    versions = list(split) or ([active] if active else [])
    versions += [v for v in sorted(tags) if v not in versions]
    rows = []
    for version in versions:
        share = split.get(version, 0) if split else (100 if version == active else 0)
        mark = "*" if version == active else " "
        row = [f"{mark} {version}", f"{share}%", ", ".join(sorted(tags.get(version, []))) or "-"]
        if figures:
            seen = figures.get(version)
            if seen is None or not seen["requests"]:
                row += ["-", "-", "-"]
            else:
                p99 = seen["p99_ms"]
                row += [
                    f"{seen['requests_per_s']:g}",
                    f"{seen['error_ratio']:.1%}",
                    "-" if p99 is None else f"{p99:g} ms",
                ]
        rows.append(row)
    headers = ["VERSION", "SHARE", "TAGS"]
    if figures:
        seconds = report.get("window_seconds", 60)
        headers += [f"REQ/S ({seconds:g} s)", "5XX", "P99"]
    return table(headers, rows)
