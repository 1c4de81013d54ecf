"""The Node stack: `package.json`, with `package-lock.json` or `npm-shrinkwrap.json` (`npm
ci`) or alone (`npm install`, as reproducible as its version ranges); yarn, pnpm and bun lock
files are refused. The start command is `node FILE` when the start script is exactly that,
else `npm start`, else `node` of `main` or a usual file."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from .common import (
    CA,
    LEFT_OUT,
    PORT,
    BuildChoice,
    Plan,
    PlanError,
    Read,
    base_of,
    cmd,
    start_line,
    version_file,
)

NODE_BASE = "docker.io/library/node:{version}-slim"


def node(names: frozenset[str], read: Read, choice: BuildChoice) -> Plan | None:
    if "package.json" not in names:
        return None
    try:
        package = json.loads(read("package.json") or "")
    except ValueError as exc:
        raise PlanError(f"package.json: not valid JSON: {exc}") from None
    if not isinstance(package, dict):
        raise PlanError("package.json: must hold an object")
    for other in ("yarn.lock", "pnpm-lock.yaml", "bun.lockb", "bun.lock"):
        if other in names:
            raise PlanError(
                f"{other}: only npm's lock file (package-lock.json) is built for now; "
                "add a Containerfile to build with another package manager"
            )
    if "package-lock.json" in names:
        source, copy, install = (
            "package.json + package-lock.json",
            "package.json package-lock.json",
            "npm ci --omit=dev",
        )
    elif "npm-shrinkwrap.json" in names:
        source, copy, install = (
            "package.json + npm-shrinkwrap.json",
            "package.json npm-shrinkwrap.json",
            "npm ci --omit=dev",
        )
    else:
        source, copy, install = "package.json", "package.json", "npm install --omit=dev"
    version = version_file(read, (".nvmrc", ".node-version"), "20")
    start = start_line(read, choice, _node_convention(package, names), "Node", "no `start` script")
    text = (
        f"# Made by wakeful for a Node app ({source}); `wakeful deploy --dry-run` prints it.\n"
        f"FROM {base_of(choice, NODE_BASE, version)}\n"
        "ENV NODE_ENV=production npm_config_update_notifier=false npm_config_fund=false\n"
        "WORKDIR /app\n"
        f"# The dependencies in a layer of their own, keyed on {copy.replace(' ', ' and ')}.\n"
        f"COPY {copy} ./\n"
        "RUN " + CA.format(variable="NODE_EXTRA_CA_CERTS") + f"{install} && rm -rf /root/.npm\n"
        "COPY . .\n"
        f"ENV PORT={PORT}\nEXPOSE {PORT}\n" + cmd(start, choice)
    )
    return Plan(
        "stack",
        f"stack node ({source})",
        generated=text,
        start=start,
        ignore=(*LEFT_OUT, "node_modules", "npm-debug.log"),
    )


def _node_convention(package: dict[str, Any], names: frozenset[str]) -> str | None:
    """`node FILE` when the start script is exactly that (no npm between the app and its
    signals), `npm start` for any other start script, else `node` of `main` or a usual file."""
    scripts = package.get("scripts")
    start = scripts.get("start") if isinstance(scripts, dict) else None
    if isinstance(start, str) and start.strip():
        words = start.split()
        if len(words) == 2 and words[0] == "node" and re.fullmatch(r"[A-Za-z0-9_./-]+", words[1]):
            return f"node {words[1]}"
        return "npm start"
    main = package.get("main")
    if isinstance(main, str) and main in names:
        return f"node {shlex.quote(main)}"
    for name in ("server.js", "index.js", "app.js"):
        if name in names:
            return f"node {name}"
    return None
