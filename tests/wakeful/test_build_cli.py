"""`wakeful deploy --dry-run DIR` (issue 37): what a directory is, the Containerfile its build
uses and what it runs, with no control plane and nothing built; and a build with no builder on
the PATH is a clear error naming all three."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
EXAMPLES = Path(__file__).parents[2] / "examples"


def wakeful(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )


def test_a_dry_run_prints_the_generated_containerfile_and_the_command() -> None:
    done = wakeful("deploy", "--dry-run", str(EXAMPLES / "fastapi"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("built from stack python (requirements.txt)")
    assert "FROM docker.io/library/python:3.11-slim" in lines
    assert lines[-1] == "# runs: uvicorn main:app --host 0.0.0.0 --port $PORT"


def test_a_dry_run_of_a_directory_app_and_of_an_image_builds_nothing() -> None:
    done = wakeful("deploy", "--dry-run", str(EXAMPLES / "hello"))
    assert done.stdout.strip().endswith("a directory app (nothing to build); runs python3 app.py")
    image = wakeful("deploy", "--dry-run", "--image", "example.com/shop:1", "--name", "shop")
    assert image.stdout.strip() == "runs the image example.com/shop:1 (nothing to build)"


def test_no_builder_names_all_three_and_deploys_nothing(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "wakeful.toml").write_text('name = "app"\n')
    (app / "Containerfile").write_text("FROM scratch\n")
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {
        **os.environ,
        "PATH": str(bare),
        "WAKEFUL_API": "http://127.0.0.1:9",
        "WAKEFUL_TOKEN": "x",
    }
    done = wakeful("deploy", str(app), env=env)
    assert done.returncode == 1
    assert "install podman, buildah or docker" in done.stderr


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`wakeful deploy --dry-run DIR | head -1`: the rest is not written, and nothing else."""
    with subprocess.Popen(
        [*WAKEFUL, "deploy", "--dry-run", str(EXAMPLES / "fastapi")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # before it writes its first line
        stderr = process.stderr.read()
        process.wait(timeout=60)
    assert b"Traceback" not in stderr, stderr
