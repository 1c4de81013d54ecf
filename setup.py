"""The build's one step beyond pyproject.toml: the ingress's per-request modules compiled with
mypyc (`wakeful/native.py` names them and says how the compiled ones are chosen at run time).

Compiled when mypyc (a build requirement) and a C compiler are there; otherwise, or when the
compile fails, or with WAKEFUL_PURE_PYTHON set, the same modules install as plain Python, with
a line saying so: nothing a user runs needs the compiler.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
native = runpy.run_path(str(HERE / "wakeful" / "native.py"))


def _say(line: str) -> None:
    sys.stderr.write(f"wakeful build: {line}\n")


def _extensions() -> list[Any]:
    """mypyc's extension modules for `native.COMPILED`, or none (pure Python), saying why."""
    if native["pure_python_asked"]():
        _say("WAKEFUL_PURE_PYTHON is set: the ingress stays pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed here: the ingress stays pure Python")
        return []
    paths = [str(native["source_of"](module, HERE / "wakeful")) for module in native["COMPILED"]]
    try:  # type-checks first, against the installed dependencies (an isolated build has none)
        built = mypycify([os.path.relpath(p, HERE) for p in paths], group_name="wakeful_native")
    except (Exception, SystemExit) as exc:
        _say(f"mypyc cannot compile the ingress here ({exc}): it stays pure Python")
        return []
    return list(built)


class CompileOrNot(build_ext):
    """Builds the compiled modules and writes their sources' digests (`native.MANIFEST`); a
    failed compile leaves pure Python, with the reason."""

    def run(self) -> None:
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # no C compiler, missing headers: the sources still work
            _say(f"compiling the ingress failed ({exc}): it stays pure Python")
            return
        recorded = json.dumps(native["manifest"](HERE / "wakeful"), indent=1, sort_keys=True)
        targets = [Path(self.build_lib) / "wakeful"]
        if self.inplace:
            targets.append(HERE / "wakeful")
        for target in targets:
            target.mkdir(parents=True, exist_ok=True)
            (target / native["MANIFEST"]).write_text(recorded + "\n")
        _say(f"compiled {len(native['COMPILED'])} ingress modules with mypyc")


setup(ext_modules=_extensions(), cmdclass={"build_ext": CompileOrNot})
