"""`wakeful up` as a user who is not root, in a fresh directory, as the README's first command
runs it. Every file it makes lands inside the data directory, which is resolved against the
current directory once, at start (the default `./.wakeful`, or a relative `--data-dir`).

Run as root (CI), the test runs wakeful as `nobody` with the system's Python (a root-only
Python install is not readable by other users) and this checkout plus the venv's packages on
its path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.up import make_app
from wakeful.store import parse_store_url
from wakeful.store.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def as_user() -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment that run wakeful as a non-root user."""
    packages = sysconfig.get_paths()["purelib"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if os.geteuid() != 0:
        return [sys.executable], {**env, "PYTHONPATH": f"{ROOT}:{packages}"}
    if not SYSTEM_PYTHON.exists():
        pytest.fail(f"{SYSTEM_PYTHON} is needed to run wakeful as another user")
    runuser = shutil.which("runuser")
    assert runuser is not None, "util-linux's runuser is needed to run as another user"
    return (
        [runuser, "-u", "nobody", "--", str(SYSTEM_PYTHON)],
        {**env, "PYTHONPATH": f"{ROOT}:{packages}", "HOME": "/nonexistent"},
    )


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh directory the other user owns (outside pytest's root-only tmp tree)."""
    path = Path(tempfile.mkdtemp(prefix="wakeful-user-"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(path, "nobody", "nogroup")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_up(workdir: Path, data_dir_args: list[str]) -> tuple[int, str]:
    app = make_app(workdir)
    if os.geteuid() == 0:
        for path in [app, *app.rglob("*")]:
            shutil.chown(path, "nobody", "nogroup")
    prefix, env = as_user()
    proxy, api, admin = free_port(), free_port(), free_port()
    command = [
        *prefix,
        "-m",
        "wakeful.cli",
        *data_dir_args,
        "up",
        "hello",
        "--listen",
        f"127.0.0.1:{proxy}",
        "--api-listen",
        f"127.0.0.1:{api}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
    ]
    process = subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        status = 0
        while time.monotonic() < deadline and process.poll() is None:
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{proxy}/", headers={"Host": "hello.localhost"}, timeout=30
                )
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            status = answer.status_code
            if status == 200:
                break
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    return status, output


@pytest.mark.parametrize(
    ("args", "data_dir"),
    [([], ".wakeful"), (["--data-dir", "data"], "data")],
    ids=["default data dir", "relative --data-dir"],
)
def test_wakeful_up_as_a_user_keeps_every_file_in_its_data_dir(
    workdir: Path, args: list[str], data_dir: str
) -> None:
    status, output = run_up(workdir, args)
    assert status == 200, output
    inside = workdir / data_dir
    assert (inside / "store.db").is_file(), output
    assert (inside / "token").is_file()
    assert (inside / "artifacts").is_dir()
    made = {p.name for p in workdir.iterdir()}
    assert made == {"hello", data_dir}, made
    assert not Path("/", data_dir, "store.db").exists()


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///.wakeful/store.db", ".wakeful/store.db"),
        ("sqlite:///data/w.db", "data/w.db"),
        ("sqlite:////var/lib/wakeful/w.db", "/var/lib/wakeful/w.db"),
    ],
)
def test_sqlite_urls_take_three_slashes_for_relative_and_four_for_absolute(
    url: str, path: str
) -> None:
    assert parse_store_url(url) == ("sqlite", path)


def test_a_relative_store_url_is_resolved_once_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wakeful.node.settings import NodeSettings

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WAKEFUL_STORE_URL", raising=False)
    monkeypatch.delenv("WAKEFUL_DATA_DIR", raising=False)
    settings = NodeSettings()
    assert settings.store_url == f"sqlite:///{tmp_path}/.wakeful/store.db"
    assert settings.data_dir == tmp_path / ".wakeful"


def test_an_unwritable_data_dir_is_named_with_exit_1(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        prefix, env = as_user()
    else:
        prefix, env = [sys.executable], {**os.environ}
    blocked = Path(tempfile.mkdtemp(prefix="wakeful-ro-"))
    try:
        blocked.chmod(0o555)
        done = subprocess.run(
            [*prefix, "-m", "wakeful.cli", "--data-dir", str(blocked / "d"), "up"],
            cwd=blocked,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        shutil.rmtree(blocked, ignore_errors=True)
    assert done.returncode == 1, done.stderr
    assert f"--data-dir {blocked / 'd'}" in done.stderr
    assert "Permission denied" in done.stderr
    assert "listen" not in done.stderr
