"""`wakeful.domain` stays pure: what an import contract cannot see.

The domain is the ground layer every component shares (models, tables, formats, decisions);
what is decided there is tested by tables, without sockets, files, tasks or time. Its imports
are held by the `forbidden` contract in `pyproject.toml` (no `os`, `asyncio`, `socket`,
`tarfile`, `logging`, `time`, ...; `lint-imports`). This test reads each module's syntax tree
for the rest: an environment read (`os.environ` reached some other way, `getenv`) and a call of
`open`, `print` or `input`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parents[2] / "wakeful" / "domain"
MODULES = sorted(DOMAIN.rglob("*.py"))
BUILTINS = frozenset({"open", "print", "input"})


def impurities(source: str) -> list[str]:
    """What in `source` is not pure and no import shows, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            found.append(f"line {node.lineno}: reads the environment ({node.attr})")
        elif isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            found.append(f"line {node.lineno}: reads the environment ({node.id})")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in BUILTINS
        ):
            found.append(f"line {node.lineno}: calls {node.func.id}()")
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import re\nx = re.compile('a')\n", [], id="plain computation is pure"),
        pytest.param(
            "ENABLED = env.environ.get('WAKEFUL_TRACE', '')\n",
            ["line 1: reads the environment (environ)"],
            id="an environment read is refused whatever it is reached through",
        ),
        pytest.param(
            "x = getenv('HOME')\n",
            ["line 1: reads the environment (getenv)"],
            id="getenv by its bare name is refused",
        ),
        pytest.param(
            "data = open('app.toml').read()\n", ["line 1: calls open()"], id="open() is refused"
        ),
        pytest.param("print('decided')\n", ["line 1: calls print()"], id="print() is refused"),
        pytest.param(
            "def f(opener):\n    return opener.open()\n",
            [],
            id="a method called open is not the builtin",
        ),
    ],
)
def test_impurities_are_found(source: str, expected: list[str]) -> None:
    assert impurities(source) == expected


@pytest.mark.parametrize("module", MODULES, ids=[m.relative_to(DOMAIN).as_posix() for m in MODULES])
def test_the_domain_module_is_pure(module: Path) -> None:
    found = impurities(module.read_text())
    assert not found, f"{module.relative_to(DOMAIN.parents[1])} is not pure: {found}"
