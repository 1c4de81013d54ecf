"""The ingress compiled with mypyc, and its pure-Python twin (`wakeful.native`): the suite runs
on whichever the checkout was built with (scripts/test compiles it); here the exchange's tests
run again as pure Python, the sources win over a build they have changed since, and a build
that matches them is the one imported."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from wakeful import native

ROOT = Path(__file__).parents[2]
EXCHANGE_TESTS = [
    "tests/ingress/test_direct.py",
    "tests/ingress/test_edge.py",
    "tests/ingress/test_http1.py",
    "tests/ingress/test_http2.py",
    "tests/ingress/test_streaming.py",
    "tests/ingress/test_upstream.py",
    "tests/ingress/test_websocket.py",
    "tests/ingress/upstream/test_h2c.py",
]
"""The exchange end to end in one process: HTTP/1.1, HTTP/2, bodies, WebSockets, h2c."""

IMPORTED = (
    "import wakeful, wakeful.ingress.proxy as proxy, wakeful.ingress.http2.stream as stream; "
    "print(wakeful.NATIVE); print(proxy.__file__); print(stream.__file__)"
)


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter with `args`, from the checkout's root (its build, or its sources)."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def _imported(env: dict[str, str]) -> list[str]:
    done = _python(env, "-c", IMPORTED)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_exchange_gives_the_same_answers_as_pure_python() -> None:
    env = {**os.environ, "WAKEFUL_PURE_PYTHON": "1"}
    chosen, *files = _imported(env)
    assert chosen in ("pure", "pure: WAKEFUL_PURE_PYTHON"), chosen
    assert all(f.endswith(".py") for f in files), files
    done = _python(env, "-m", "pytest", "-q", "-p", "no:cacheprovider", *EXCHANGE_TESTS)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


@pytest.mark.skipif(not native.compiled_present(), reason="built without a compiler")
def test_a_build_that_matches_its_sources_is_what_runs() -> None:
    recorded = json.loads((native.PACKAGE / native.MANIFEST).read_text())
    if native.stale(recorded):
        pytest.skip("sources changed since the build (compile again: scripts/test does)")
    env = {k: v for k, v in os.environ.items() if k != "WAKEFUL_PURE_PYTHON"}
    chosen, *files = _imported(env)
    assert chosen == "compiled"
    assert all(f.endswith(".so") for f in files), files


def test_a_changed_source_is_stale_and_every_module_has_a_source(tmp_path: Path) -> None:
    for module in native.COMPILED:
        assert native.source_of(module).exists(), module
        copy = native.source_of(module, tmp_path)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(native.source_of(module).read_bytes())
    recorded = native.manifest(tmp_path)
    assert native.stale(recorded, tmp_path) == []
    edited = native.source_of("wakeful.ingress.retry", tmp_path)
    edited.write_text(edited.read_text() + "# edited\n")
    assert native.stale(recorded, tmp_path) == ["wakeful.ingress.retry"]


@pytest.mark.parametrize(
    ("value", "asked"), [("1", True), ("yes", True), ("0", False), ("", False)]
)
def test_pure_python_is_asked_by_any_value_but_empty_or_zero(value: str, asked: bool) -> None:
    assert native.pure_python_asked({"WAKEFUL_PURE_PYTHON": value}) is asked


def test_a_module_the_build_compiled_and_the_list_no_longer_names_is_stale(
    tmp_path: Path,
) -> None:
    """Its extension would be imported for ever: the guard must send it to its source."""
    recorded = {"wakeful.ingress.gone": "0" * 64}
    assert native.stale(recorded, tmp_path)[0] == "wakeful.ingress.gone"


def test_extension_modules_without_the_builds_record_are_found(tmp_path: Path) -> None:
    assert native.extensions_without_record(tmp_path) == []
    source = native.source_of("wakeful.ingress.proxy", tmp_path)
    source.parent.mkdir(parents=True)
    source.write_text("")
    source.with_suffix(EXTENSION_SUFFIXES[0]).write_bytes(b"")
    assert native.extensions_without_record(tmp_path) == ["wakeful.ingress.proxy"]


def test_no_compiled_module_awaits_in_a_finally() -> None:
    """mypyc (the pinned version) loses a cancellation thrown into a compiled coroutine
    that awaits in its `finally`, which then returns None to its compiled caller
    (mypyc/mypyc#1114; docs/design/data-plane.md, "Out of the interpreter"): none of the
    compiled modules may have one."""
    found = []
    for module in native.COMPILED:
        source = native.source_of(module)
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Try):
                for statement in node.finalbody:
                    for inner in ast.walk(statement):
                        if isinstance(inner, (ast.Await, ast.AsyncWith, ast.AsyncFor)):
                            found.append(f"{source}:{inner.lineno}")
    assert found == []
