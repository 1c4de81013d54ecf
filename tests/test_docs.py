"""The documentation stays in step with the code: every relative link and every file path it
names exists, and nothing points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *ROOT.joinpath("docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
OUTSIDE = re.compile(r"\.\./shared\b|\bshared[/]seeds\b")
TOP = "wakeful|activator|ingress|idle_monitor|deploy|tests|bench"
CODE_PATH = re.compile(rf"`((?:{TOP})/[\w/.]+\.py)")
NAMED_TEST = re.compile(r"\[[\w./]+::(\w+)[^\]]*\]\(([^)#\s]+\.py)\)")
"""A link whose text names a test, `[test_x.py::test_y](../tests/x/test_x.py)`."""


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_links_and_named_files_exist(doc: Path) -> None:
    text = doc.read_text()
    missing = [
        target
        for target in LINK.findall(text)
        if "://" not in target and not (doc.parent / target).exists()
    ]
    missing += [path for path in CODE_PATH.findall(text) if not (ROOT / path).exists()]
    assert not missing, f"{doc.name} names what does not exist: {missing}"
    assert not OUTSIDE.search(text), f"{doc.name} points outside the repository"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_test_a_doc_names_exists(doc: Path) -> None:
    """The decision index and the invariants name tests: each named test is defined in the
    file the link points at (a renamed or deleted test fails here)."""
    missing = []
    for name, target in NAMED_TEST.findall(doc.read_text()):
        path = doc.parent / target
        if path.exists() and not re.search(rf"^(async )?def {name}\b", path.read_text(), re.M):
            missing.append(f"{target}::{name}")
    assert not missing, f"{doc.name} names tests that do not exist: {missing}"
