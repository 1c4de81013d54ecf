"""A build context is hostile input (`wakeful.build.context`): links that leave the directory,
FIFOs and devices are refused by name, files and bytes are bounded, and what the build leaves
out is not counted (unless an exception in the ignore file makes that unsafe)."""

from __future__ import annotations

import os
import re
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
    with pytest.raises(ContextRefused, match=re.escape(f"{link!r}: a link to {target!r}")):
        check_context(context)


def test_a_fifo_is_refused(context: Path) -> None:
    os.mkfifo(context / "pkg" / "pipe")
    with pytest.raises(ContextRefused, match="'pkg/pipe': not a file"):
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


@pytest.mark.parametrize(
    ("pattern", "path", "left_out"),
    [
        pytest.param("big", "big", True, id="a name at the top"),
        pytest.param("big", "sub/big", False, id="anchored at the top, as the builder reads it"),
        pytest.param("*.log", "sub/debug.log", False, id="a star stays in its segment"),
        pytest.param("**/*.log", "sub/deep/debug.log", True, id="two stars cross segments"),
        pytest.param("**/.git", ".git", True, id="two stars match no segment too"),
        pytest.param("sub", "sub/deep/x", True, id="a directory leaves out all under it"),
        pytest.param("s?b/x", "sub/x", True, id="a question mark is one character"),
        pytest.param("[a-c]*", "big", True, id="a class"),
    ],
)
def test_ignore_patterns_match_as_the_builder_matches(
    context: Path, pattern: str, path: str, left_out: bool
) -> None:
    target = context / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("x" * 1000)
    size = check_context(context, (pattern,))
    assert (size.bytes < 1000) is left_out


@pytest.mark.parametrize(
    "marks",
    [
        pytest.param((".wakeful/x",), id="a .wakeful directory"),
        pytest.param(("state/token", "state/store.db"), id="a token beside a store"),
        pytest.param(("state/token", "state/secret-keys/k.key"), id="a token beside its keys"),
    ],
)
def test_a_wakeful_data_directory_is_refused(context: Path, marks: tuple[str, ...]) -> None:
    for mark in marks:
        (context / mark).parent.mkdir(parents=True, exist_ok=True)
        (context / mark).write_text("secret")
    with pytest.raises(ContextRefused, match="is a wakeful data directory"):
        check_context(context)
    check_context(context, ("**/.wakeful", "state"))  # left out: nothing of it is sent


def test_a_link_that_leaves_through_another_link_is_refused(context: Path) -> None:
    (context / "d").symlink_to(".")
    (context / "e").symlink_to("d/../secret")
    with pytest.raises(
        ContextRefused, match=re.escape("'e': a link to 'd/../secret', which leads out")
    ):
        check_context(context)


def test_an_ignore_file_that_is_a_link_or_too_large_is_refused(context: Path) -> None:
    (context / ".dockerignore").symlink_to("/proc/kmsg")
    with pytest.raises(ContextRefused, match="not a regular file"):
        ignore_patterns(context, ())
    (context / ".dockerignore").unlink()
    (context / ".dockerignore").write_text("x\n" * (1 << 20))
    with pytest.raises(ContextRefused, match="larger than"):
        ignore_patterns(context, ())


def test_docker_reads_only_dockerignore(context: Path) -> None:
    (context / ".containerignore").write_text("pkg\n")
    assert ignore_patterns(context, ("d",), "docker") == ("d",)
    assert ignore_patterns(context, ("d",), "podman") == ("pkg",)


def test_a_name_with_a_line_break_is_quoted_in_the_refusal(context: Path) -> None:
    os.mkfifo(context / "evil\nwakeful: fine")
    with pytest.raises(ContextRefused, match=r"'evil\\nwakeful: fine': not a file"):
        check_context(context)
