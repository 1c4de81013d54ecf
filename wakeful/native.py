"""The ingress's per-request modules compiled with mypyc (issue 42), and when they are used.

`setup.py` compiles `COMPILED` when mypyc, the project's dependencies and a C compiler are
there (`pip install --no-build-isolation -e .` once they are installed, as scripts/up and
scripts/test do: the extension modules land beside the sources) and writes `native.json`
beside this file: each compiled module's source digest. Python imports an
extension module before the source of the same name, so a checkout whose sources changed
after the build would run the old code. `guard` (run by `wakeful/__init__.py`, before any of
them is imported) sends every one of `COMPILED` to its source instead, all together, when:

- WAKEFUL_PURE_PYTHON is set (to anything but "" or "0"): the pure-Python path on purpose;
- any compiled module's source no longer matches its digest (edited since the build), or
  the build compiled a module `COMPILED` no longer lists: a line on stderr says to compile
  again;
- extension modules are there without the build's record (compiled by hand, or a build cut
  short).

All or none, because a class in a source module may not inherit from one in a compiled
module. Nothing here imports the rest of `wakeful`: `setup.py` reads `COMPILED` from it
before anything is installed. The async generators the proxy uses live in
`wakeful.ingress.streams`, which is not compiled (mypyc compiles none).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

COMPILED = (
    "wakeful.aio.deadline",
    "wakeful.aio.flow",
    "wakeful.domain.sampling",
    "wakeful.ingress.accesslog",
    "wakeful.ingress.admin",
    "wakeful.ingress.cache",
    "wakeful.ingress.cacherules",
    "wakeful.ingress.clients",
    "wakeful.ingress.direct",
    "wakeful.ingress.edge",
    "wakeful.ingress.errors",
    "wakeful.ingress.formats",
    "wakeful.ingress.grpc",
    "wakeful.ingress.headers",
    "wakeful.ingress.http1.connection",
    "wakeful.ingress.http1.request",
    "wakeful.ingress.http1.responder",
    "wakeful.ingress.http1.rules",
    "wakeful.ingress.http1.server",
    "wakeful.ingress.http1.wire",
    "wakeful.ingress.http2.client",
    "wakeful.ingress.http2.connection",
    "wakeful.ingress.http2.fields",
    "wakeful.ingress.http2.frames",
    "wakeful.ingress.http2.budgets",
    "wakeful.ingress.http2.rules",
    "wakeful.ingress.http2.sender",
    "wakeful.ingress.http2.stream",
    "wakeful.ingress.http2.streams",
    "wakeful.ingress.http2.wire",
    "wakeful.ingress.load",
    "wakeful.ingress.metrics",
    "wakeful.ingress.preread",
    "wakeful.ingress.proxy",
    "wakeful.ingress.retry",
    "wakeful.ingress.routing",
    "wakeful.ingress.transport",
    "wakeful.ingress.upstream.bases",
    "wakeful.ingress.upstream.connection",
    "wakeful.ingress.upstream.exchange",
    "wakeful.ingress.upstream.h2c",
    "wakeful.ingress.upstream.h2exchange",
    "wakeful.ingress.upstream.handshake",
    "wakeful.ingress.upstream.pool",
    "wakeful.ingress.upstream.raw",
    "wakeful.ingress.upstream.rules",
    "wakeful.ingress.websocket",
)
"""Every module of the exchange: the protocols, the proxy and the upstream connections, and
what they call per request (a compiled class's subclasses must be compiled too)."""

MANIFEST = "native.json"
"""Beside this file: {module: sha256 of its source when it was compiled}."""

PACKAGE = Path(__file__).resolve().parent


def source_of(module: str, root: Path = PACKAGE) -> Path:
    """The source file of `module` (a `wakeful.` name) under the package directory `root`."""
    return root.joinpath(*module.split(".")[1:]).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(root: Path = PACKAGE) -> dict[str, str]:
    """What `setup.py` writes: each compiled module's source digest."""
    return {module: digest(source_of(module, root)) for module in COMPILED}


def stale(recorded: dict[str, str], root: Path = PACKAGE) -> list[str]:
    """The compiled modules whose sources differ from when they were compiled, and those
    compiled by a build that listed them and no longer listed (their extension would run)."""
    found = []
    for module in sorted(set(COMPILED) | set(recorded)):
        if module not in COMPILED:
            found.append(module)
            continue
        try:
            now = digest(source_of(module, root))
        except OSError:
            continue  # an installed wheel may carry no sources: nothing to be stale against
        if recorded.get(module) != now:
            found.append(module)
    return found


def extensions_without_record(root: Path = PACKAGE) -> list[str]:
    """Modules of `COMPILED` with an extension module beside their source but no record of
    the build (`MANIFEST` missing): compiled by hand, or a build cut short."""
    found = []
    for module in COMPILED:
        source = source_of(module, root)
        if any(source.with_suffix(suffix).exists() for suffix in EXTENSION_SUFFIXES):
            found.append(module)
    return found


def pure_python_asked(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("WAKEFUL_PURE_PYTHON", "") not in ("", "0")


class _Sources(importlib.abc.MetaPathFinder):
    """Finds each of `modules` as its source file, ahead of the extension module."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        source = source_of(fullname)
        if not source.exists():
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def compiled_present(root: Path = PACKAGE) -> bool:
    return (root / MANIFEST).exists()


def guard() -> str:
    """Choose, once per process, between the compiled modules and their sources (see the
    module docstring); what was chosen: "compiled", "pure" (none built) or the reason the
    sources are used."""
    recorded: dict[str, str] = {}
    if not compiled_present():
        if not extensions_without_record():
            return "pure"
        why = "pure: compiled modules without their build's record"
    elif pure_python_asked():
        why = "pure: WAKEFUL_PURE_PYTHON"
    else:
        try:
            recorded = json.loads((PACKAGE / MANIFEST).read_text())
        except (OSError, ValueError):
            recorded = {}
        changed = stale(recorded)
        why = ""
        if changed:
            why = f"pure: {len(changed)} module(s) changed since they were compiled"
            sys.stderr.write(
                f"wakeful: {changed[0]} (and {len(changed) - 1} more) changed since it was "
                "compiled: the ingress runs as pure Python; compile it again with "
                "`.venv/bin/python -m pip install --no-build-isolation --no-deps -e .`\n"
            )
    if why and not any(isinstance(f, _Sources) for f in sys.meta_path):
        sys.meta_path.insert(0, _Sources(set(COMPILED) | set(recorded)))
    return why or "compiled"
