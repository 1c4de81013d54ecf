"""A build context is hostile input (`wakeful.build.context`): links that leave the directory,
FIFOs and devices are refused by name, files and bytes are bounded, and what the build leaves
out is not counted (unless an exception in the ignore file makes that unsafe)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wakeful.build import ContextRefused, check_context, ignore_patterns


@pytest.fixture
def context(tmp_path: Path) -> Path:
    root = tmp_path / "app"
    (root / "pkg").mkdir(parents=True)
    (root / "main.py").write_text("print(1)\n")
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "pkg" / "alias.py").symlink_to("mod.py")
    (root / "up.py").symlink_to("pkg/../main.py")
    return root


def test_a_plain_context_is_measured(context: Path) -> None:
    size = check_context(context)
    assert (size.files, size.bytes) == (5, len("print(1)\n") + len("x = 1\n"))


@pytest.mark.parametrize(
    ("link", "target"),
    [
        pytest.param("passwd", "/etc/passwd", id="an absolute link"),
        pytest.param("pkg/out", "../../outside", id="a link that climbs out"),
        pytest.param("pkg/sneaky", "../pkg/../../outside", id="one that climbs out by a detour"),
    ],
)
def test_a_link_out_of_the_directory_is_refused_by_name(
    context: Path, link: str, target: str
) -> None:
    (context / link).symlink_to(target)
    with pytest.raises(ContextRefused, match=f"{link}: a link to {target}"):
        check_context(context)


def test_a_fifo_is_refused(context: Path) -> None:
    os.mkfifo(context / "pkg" / "pipe")
    with pytest.raises(ContextRefused, match="pkg/pipe: not a file"):
        check_context(context)


def test_files_and_bytes_are_bounded(context: Path) -> None:
    with pytest.raises(ContextRefused, match="more than 4 files"):
        check_context(context, max_files=4)
    with pytest.raises(ContextRefused, match="larger than 10 bytes"):
        check_context(context, max_bytes=10)


def test_what_the_build_leaves_out_is_not_walked(context: Path) -> None:
    modules = context / "node_modules" / "left"
    modules.mkdir(parents=True)
    (modules / "evil").symlink_to("/etc/shadow")
    (context / ".dockerignore").write_text("# comments too\nnode_modules/\n*.log\n")
    (context / "debug.log").write_text("x" * 1000)
    patterns = ignore_patterns(context, ("never-used",))
    assert patterns == ("node_modules", "*.log")
    assert check_context(context, patterns).bytes < 1000


def test_an_exception_in_the_ignore_file_makes_the_walk_count_everything(context: Path) -> None:
    (context / ".containerignore").write_text("*.log\n!keep.log\n")
    assert ignore_patterns(context, (".git",)) == ()


def test_a_stack_s_defaults_apply_without_an_ignore_file(context: Path) -> None:
    assert ignore_patterns(context, (".git", ".venv")) == (".git", ".venv")
