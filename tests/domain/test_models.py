"""The data model (wakeful/domain/models/): one public surface over its modules, and sizes.

Over a hundred modules import from `wakeful.domain.models` alone, whichever of its modules
defines a name; the surface test keeps a record added to one of them importable from there.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest
from pydantic import ValidationError

from wakeful.domain import models
from wakeful.domain.models import AppSpec, format_size, parse_size

MODULES = sorted(
    info.name for info in pkgutil.iter_modules(models.__path__, prefix=f"{models.__name__}.")
)


def defined_in(module: ModuleType) -> set[str]:
    """The public names `module` binds at its top level (what it imports is not one of them)."""
    names: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("name", MODULES, ids=[m.rsplit(".", 1)[1] for m in MODULES])
def test_every_name_a_module_defines_is_importable_from_the_package(name: str) -> None:
    missing = defined_in(importlib.import_module(name)) - set(models.__all__)
    assert not missing, f"{name} defines {sorted(missing)}: add them to models.__all__"


def test_every_exported_name_exists() -> None:
    assert [name for name in models.__all__ if not hasattr(models, name)] == []


@pytest.mark.parametrize(
    ("text", "size"),
    [
        pytest.param("256Mi", 256 << 20, id="256Mi is 256 mebibytes"),
        pytest.param("1Gi", 1 << 30, id="1Gi is a gibibyte"),
        pytest.param(" 64 Ki ", 64 << 10, id="spaces around the number and the unit are read"),
        pytest.param("4096", 4096, id="a number alone is bytes"),
        pytest.param(1 << 20, 1 << 20, id="an integer is already bytes"),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("1G", id="a decimal unit is refused"),
        pytest.param("1.5Gi", id="a fraction is refused"),
        pytest.param("-1Mi", id="a negative size is refused"),
        pytest.param("", id="nothing is refused"),
    ],
)
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        pytest.param(2 << 30, "2Gi", id="whole gibibytes in Gi"),
        pytest.param(1536 << 20, "1536Mi", id="not whole gibibytes falls to Mi"),
        pytest.param(3 << 10, "3Ki", id="whole kibibytes in Ki"),
        pytest.param(1000, "1000", id="anything else in bytes"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("X\n", id="a trailing newline ($ matches before one)"),
        pytest.param("2X", id="a leading digit"),
        pytest.param("A-B", id="a dash"),
    ],
)
def test_a_manifest_env_name_that_is_not_one_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="is not a valid environment variable name"):
        AppSpec(command=["serve"], env={name: "v"})
