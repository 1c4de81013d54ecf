"""Which builder a build uses (`wakeful.build.tools.find_builder`), and the error that names
all three when none is installed."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from wakeful.build import BuildEnvironment, BuilderError, BuildFailed, build, find_builder
from wakeful.build.tools import Builder, bounded_lines, build_command
from wakeful.deploy.appdir import load_app_dir


def installed(*names: str) -> object:
    return lambda name: f"/usr/bin/{name}" if name in names else None


@pytest.mark.parametrize(
    ("chosen", "present", "found"),
    [
        pytest.param(None, ("podman", "buildah", "docker"), "podman", id="podman first"),
        pytest.param(None, ("buildah", "docker"), "buildah", id="then buildah"),
        pytest.param(None, ("docker",), "docker", id="then docker"),
        pytest.param("docker", ("podman", "docker"), "docker", id="WAKEFUL_BUILDER chooses"),
    ],
)
def test_the_builder_found(chosen: str | None, present: tuple[str, ...], found: str) -> None:
    assert find_builder(chosen, installed(*present)) == found  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("chosen", "present", "reason"),
    [
        pytest.param(None, (), "install podman, buildah or docker", id="none installed"),
        pytest.param("kaniko", ("podman",), "must be one of podman, buildah, docker", id="unknown"),
        pytest.param("buildah", ("podman",), "buildah is not installed", id="chosen, missing"),
    ],
)
def test_no_builder_is_a_clear_error(
    chosen: str | None, present: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(BuilderError, match=reason):
        find_builder(chosen, installed(*present))  # type: ignore[arg-type]


def test_build_output_lines_are_cut_and_never_held_whole() -> None:
    stream = io.BytesIO(b"short\n" + b"x" * 100_000 + b"\nafter\nlast")
    assert list(bounded_lines(stream, limit=10)) == [
        "short",
        "xxxxxxxxxx [line cut]",
        "after",
        "last",
    ]


def test_a_stack_built_by_docker_gets_its_ignore_file_beside_the_containerfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker reads no --ignorefile: `<Containerfile>.dockerignore` holds what the walk left
    out (here a fake docker that fails the build once it was started)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "wakeful.toml").write_text('name = "app"\n')
    (app / "package.json").write_text('{"scripts": {"start": "node server.js"}}')
    (app / "node_modules").mkdir()
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "docker").write_text('#!/bin/sh\necho "docker $*"\nexit 1\n')
    (binary / "docker").chmod(0o755)
    cache = tmp_path / "cache"
    environment = BuildEnvironment(builder="docker", build_cache=cache)
    monkeypatch.setenv("PATH", f"{binary}:{os.environ['PATH']}")
    with pytest.raises(BuildFailed) as failed:
        build(load_app_dir(app), environment, lambda line: None)
    assert "--ignorefile" not in " ".join(failed.value.last)
    ignored = (cache / "app" / "Containerfile.dockerignore").read_text().split()
    assert "node_modules" in ignored and "**/.wakeful" in ignored
    # Once the directory has its own, docker must read that one: the defaults go.
    (app / ".dockerignore").write_text("node_modules\n")
    with pytest.raises(BuildFailed):
        build(load_app_dir(app), environment, lambda line: None)
    assert not (cache / "app" / "Containerfile.dockerignore").exists()


def test_buildah_finds_an_image_id_its_own_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """buildah has no `image inspect`: `inspect --type image` says the id."""
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "buildah").write_text(
        "#!/bin/sh\n"
        '[ "$1 $2 $3" = "inspect --type image" ] && echo sha256:abc && exit 0\n'
        "exit 125\n"
    )
    (binary / "buildah").chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary}:{os.environ['PATH']}")
    assert Builder("buildah").image_id("localhost/wakeful-build/app:latest") == "sha256:abc"


CF, IGNORE, CA = Path("/c/Containerfile"), Path("/c/ignore"), Path("/etc/ca.pem")


@pytest.mark.parametrize(
    ("tool", "argv", "env"),
    [
        pytest.param(
            "podman",
            [
                "podman",
                "build",
                "-f",
                "/c/Containerfile",
                "-t",
                "t",
                "--secret",
                "id=extra_ca,src=/etc/ca.pem",
                "--ignorefile",
                "/c/ignore",
                "--label",
                "a=b",
            ],
            {},
            id="podman takes the ignore file and the secret",
        ),
        pytest.param(
            "buildah",
            [
                "buildah",
                "build",
                "--layers",
                "-f",
                "/c/Containerfile",
                "-t",
                "t",
                "--secret",
                "id=extra_ca,src=/etc/ca.pem",
                "--ignorefile",
                "/c/ignore",
                "--label",
                "a=b",
            ],
            {},
            id="buildah keeps its layers only when asked",
        ),
        pytest.param(
            "docker",
            [
                "docker",
                "build",
                "-f",
                "/c/Containerfile",
                "-t",
                "t",
                "--secret",
                "id=extra_ca,src=/etc/ca.pem",
                "--label",
                "a=b",
            ],
            {"DOCKER_BUILDKIT": "1"},
            id="docker reads its ignore file beside the Containerfile, secrets with BuildKit",
        ),
    ],
)
def test_each_builder_s_command(tool: str, argv: list[str], env: dict[str, str]) -> None:
    assert build_command(tool, CF, "t", IGNORE, CA, ["a=b"]) == (argv, env)


RACE = (
    "Error: checking if cached image exists from a previous build: "
    "getting top layer info: layer not known"
)


@pytest.mark.parametrize(
    ("failures", "last_words", "runs", "built"),
    [
        pytest.param(1, RACE, 2, True, id="a removal raced the cache lookup: built again"),
        pytest.param(2, RACE, 3, True, id="twice: built the third time"),
        pytest.param(9, RACE, 3, False, id="every time: it fails after three"),
        pytest.param(1, "Error: building at STEP 2: exit status 1", 1, False, id="other: once"),
    ],
)
def test_a_build_that_lost_a_race_with_a_removal_runs_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failures: int,
    last_words: str,
    runs: int,
    built: bool,
) -> None:
    """podman fails a build whose cache lookup meets an image another process removed
    meanwhile (as every `wakeful deploy DIR` removes its previous build's): a fake podman that
    fails `failures` times that way is run again, up to three times; any other failure once."""
    binary, count = tmp_path / "bin", tmp_path / "count"
    binary.mkdir()
    (binary / "podman").write_text(
        "#!/bin/sh\n"
        f'echo x >> "{count}"\n'
        "echo 'STEP 1/2: FROM base'\n"
        f'[ "$(wc -l < "{count}")" -gt {failures} ] && exit 0\n'
        f"echo '{last_words}'\n"
        "exit 125\n"
    )
    (binary / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{binary}:{os.environ['PATH']}")
    said: list[str] = []
    waited: list[float] = []
    builder = Builder("podman", wait=waited.append)
    if built:
        builder.build(CF, tmp_path, "t", out=said.append)
    else:
        with pytest.raises(BuildFailed) as failed:
            builder.build(CF, tmp_path, "t", out=said.append)
        assert failed.value.last[-1] == last_words
    # 1 to 3 s, then 2 to 6: another's removals have a moment to end.
    assert len(waited) == runs - 1
    bounds = [(1, 3), (2, 6)][: len(waited)]
    assert all(low <= p <= high for p, (low, high) in zip(waited, bounds, strict=True))
    assert len(count.read_text().split()) == runs
    assert said.count("STEP 1/2: FROM base") == runs
    again = [line for line in said if "building again" in line]
    assert len(again) == (runs - 1)
