"""`pip install .` gives one top-level package, `wakeful`, with real files in it, and works
beside distributions (and a user's own files) named `store` and `deploy`.

The wheel is built from this checkout (setuptools from the package index, as `pip install .`
does); it is installed without dependencies into a fresh venv whose dependencies come from this
environment's site-packages, so the test needs no network beyond the build backend.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx

from tests.support.up import make_app
from wakeful.store.testing import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_wheel_installs_one_package_and_runs_beside_store_and_deploy(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, ROOT)
    (wheel,) = wheels.glob("wakeful-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tops = {name.split("/")[0] for name in names if not name.endswith("/")}
        assert tops == {"wakeful", wheel.name.split("-")[0] + "-0.1.0.dist-info"}, tops
        # The component folders come in as real files, not links.
        core = archive.getinfo("wakeful/activator/core.py")
        assert core.file_size > 1000 and (core.external_attr >> 16) & 0o170000 != 0o120000
        for part in ("activator", "ingress", "idle_monitor", "deploy", "store", "node"):
            assert f"wakeful/{part}/__init__.py" in names, part
        for page in ("login.html", "dashboard.html", "dashboard.css", "dashboard.js"):
            assert f"wakeful/dashboard/ui/{page}" in names, page  # package data, not code

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # Distributions that own the names `store` and `deploy`, as on PyPI.
    (site / "store").mkdir()
    (site / "store" / "__init__.py").write_text("raise ImportError('the other store')\n")
    (site / "deploy.py").write_text("raise ImportError('the other deploy')\n")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "-q",
        "--no-deps",
        wheel,
    )

    # A user's project with its own store.py and deploy/ where wakeful runs.
    project = tmp_path / "project"
    project.mkdir()
    (project / "store.py").write_text("raise ImportError('the user store')\n")
    (project / "deploy").mkdir()
    (project / "deploy" / "__init__.py").write_text("raise ImportError('the user deploy')\n")
    app = make_app(project)
    proxy, api, admin = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    process = subprocess.Popen(
        [venv / "bin" / "wakeful", "up", app, "--listen", f"127.0.0.1:{proxy}",
         "--api-listen", f"127.0.0.1:{api}", "--admin-listen", f"127.0.0.1:{admin}"],
        cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    status = 0
    try:
        deadline = time.monotonic() + 60
        while status != 200 and process.poll() is None and time.monotonic() < deadline:
            try:
                status = httpx.get(
                    f"http://127.0.0.1:{proxy}/", headers={"Host": "hello.localhost"}, timeout=30
                ).status_code
            except httpx.TransportError:
                time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    assert status == 200, output
    assert (project / ".wakeful" / "store.db").exists()
    shutil.rmtree(venv)
