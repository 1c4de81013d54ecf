"""`wakeful deploy DIR` builds real apps (issue 37), as a new user meets it: a FastAPI directory
with only `main.py` and `requirements.txt`, an Express app with its lock file, a Procfile app,
a Containerfile `FROM scratch`, each built with podman and running under `wakeful up`; a code
change that sends one layer; a failed build and a hostile context that deploy nothing; and
`wakeful up DIR` building before it serves.

The stacks' bases are made by `scripts/base-image python node` from Debian's packages, named
as the stacks' defaults, so the Containerfiles built here are the ones a user gets.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import podman
from tests.support.registry import running_registry
from tests.support.up import WAKEFUL, Up, cli, start_up, stop_up

EXAMPLES = Path(__file__).parents[2] / "examples"
APPS = Path(__file__).parent / "apps"
"""Apps of these tests alone: a uv-locked Python app and a Go app."""
BUSYBOX = Path("/bin/busybox")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment the CLI builds in: podman's settings, a build cache of this module's,
    and the stacks' bases made."""
    reason = podman.usable()
    if reason is not None:
        pytest.skip(reason)
    env = {
        **podman.env(),
        "WAKEFUL_BUILD_CACHE": str(tmp_path_factory.mktemp("build-cache")),
    }
    done = subprocess.run(
        ["bash", str(podman.ROOT / "scripts" / "base-image"), "python", "node", "go"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return env


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, builds: dict[str, str]) -> Iterator[Up]:
    started = start_up(tmp_path_factory.mktemp("up"))
    try:
        yield started
    finally:
        stop_up(started)


def deploy(up: Up, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, "--data-dir", str(up.data_dir), "deploy", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def deployed(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def page(up: Up, app: str) -> str:
    answer = httpx.get(f"{up.proxy}/", headers=up.host(app), timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.text


def site(target: Path, name: str, text: str, manifest: str = "") -> Path:
    """An app directory built `FROM scratch`: busybox's httpd serving `text` as its index."""
    app = target / name
    (app / "www").mkdir(parents=True)
    shutil.copy(BUSYBOX, app / "busybox")
    (app / "www" / "index.html").write_text(text)
    (app / "wakeful.toml").write_text(f'name = "{name}"\n{manifest}')
    (app / "Containerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY www /www\nEXPOSE 8080\n"
        'ENTRYPOINT ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]\n'
    )
    return app


def copy_example(name: str, target: Path) -> Path:
    shutil.copytree(EXAMPLES / name, target / name)
    return target / name


def test_a_fastapi_directory_builds_and_a_code_change_sends_one_layer(
    up: Up, builds: dict[str, str], tmp_path: Path
) -> None:
    app = copy_example("fastapi", tmp_path)
    (app / "wakeful.toml").unlink()  # the app: nothing but its code and requirements
    assert sorted(p.name for p in app.iterdir()) == ["main.py", "requirements.txt"]
    first = deployed(deploy(up, builds, str(app)))
    assert "building fastapi (stack python (requirements.txt))" in first
    assert '"hello":"from a build"' in page(up, "fastapi")

    main = app / "main.py"
    main.write_text(main.read_text().replace("from a build", "from a rebuild"))
    again = deployed(deploy(up, builds, str(app)))
    sent = re.search(r"sent (\d+) of its (\d+) blobs", again)
    assert sent is not None, again
    assert sent.group(1) == "3", again  # the code's layer, the config, the manifest
    assert '"hello":"from a rebuild"' in page(up, "fastapi")
    versions = cli(up, "versions", "fastapi").stdout
    assert re.search(r"\* v2  stack python \(requirements.txt\)  built:fastapi@sha256:", versions)


def test_an_express_app_with_its_lock_file_builds(
    up: Up, builds: dict[str, str], tmp_path: Path
) -> None:
    app = copy_example("express", tmp_path)
    out = deployed(deploy(up, builds, str(app)))
    assert "stack node (package.json + package-lock.json)" in out
    assert '"hello":"from express"' in page(up, "express")


@pytest.mark.parametrize(
    ("name", "made", "text"),
    [
        pytest.param(
            "uv-app", "stack python (pyproject.toml + uv.lock)", "from uv.lock", id="uv.lock"
        ),
        pytest.param("go-app", "stack go (go.mod)", "from go", id="go.mod"),
    ],
)
def test_a_uv_locked_app_and_a_go_app_build(
    up: Up, builds: dict[str, str], tmp_path: Path, name: str, made: str, text: str
) -> None:
    app = shutil.copytree(APPS / name, tmp_path / name)
    out = deployed(deploy(up, builds, str(app)))
    assert f"building {name} ({made})" in out
    assert page(up, name) == text


def test_a_procfile_says_what_runs(up: Up, builds: dict[str, str], tmp_path: Path) -> None:
    app = tmp_path / "procfile"
    app.mkdir()
    (app / "wakeful.toml").write_text('name = "procfile"\n')
    (app / "requirements.txt").write_text("uvicorn==0.34.2\n")
    (app / "srv.py").write_text(
        "async def api(scope, receive, send):\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body', 'body': b'from a Procfile'})\n"
    )
    (app / "Procfile").write_text("web: uvicorn srv:api --host 0.0.0.0 --port $PORT\n")
    dry = subprocess.run(
        [*WAKEFUL, "deploy", "--dry-run", str(app)], capture_output=True, text=True, check=False
    )
    assert dry.returncode == 0, dry.stderr
    assert "# runs: uvicorn srv:api --host 0.0.0.0 --port $PORT" in dry.stdout
    assert "COPY requirements.txt ./" in dry.stdout
    deployed(deploy(up, builds, str(app)))
    assert page(up, "procfile") == "from a Procfile"


def test_a_containerfile_from_scratch_builds_as_written(
    up: Up, builds: dict[str, str], tmp_path: Path
) -> None:
    app = site(tmp_path, "scratch", "from scratch\n")
    out = deployed(deploy(up, builds, str(app)))
    assert "building scratch (Containerfile)" in out
    assert page(up, "scratch") == "from scratch\n"


def test_a_failed_build_deploys_nothing_and_shows_why(
    up: Up, builds: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "broken"
    app.mkdir()
    (app / "wakeful.toml").write_text('name = "broken"\n')
    (app / "Containerfile").write_text(
        "FROM docker.io/library/debian:bookworm-slim\nRUN echo the step that breaks && exit 3\n"
    )
    done = deploy(up, builds, str(app))
    assert done.returncode == 1
    assert "podman build failed" in done.stderr and "nothing was deployed" in done.stderr
    assert "the step that breaks" in done.stderr  # its last lines, in the error itself
    assert "broken" not in cli(up, "apps").stdout


def test_a_context_with_a_link_out_is_refused_before_any_build(
    up: Up, builds: dict[str, str], tmp_path: Path
) -> None:
    app = tmp_path / "leaky"
    app.mkdir()
    (app / "wakeful.toml").write_text('name = "leaky"\n')
    (app / "Containerfile").write_text("FROM scratch\nCOPY . /\n")
    (app / "keys").symlink_to("/etc/ssh")
    done = deploy(up, builds, str(app))
    assert done.returncode == 1
    assert "'keys': a link to '/etc/ssh', outside the app directory" in done.stderr
    assert "building" in done.stdout and "|" not in done.stdout  # no builder ran
    assert "leaky" not in cli(up, "apps").stdout


def test_wakeful_up_builds_an_app_directory_before_it_serves(
    builds: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = copy_example("fastapi", tmp_path)
    for name, value in builds.items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    started = start_up(tmp_path, app, within=600)
    try:
        assert '"hello":"from a build"' in page(started, "fastapi")
        versions = cli(started, "versions", "fastapi").stdout
        assert "* v1  stack python (requirements.txt)  built:fastapi@sha256:" in versions
    finally:
        output = stop_up(started)
    assert "building fastapi" in output
    assert re.search(r"\nbuilt sha256:[0-9a-f]{12} with podman in [0-9.]+ s \(copied out", output)


def test_build_push_sends_the_image_to_a_registry_and_deploys_it_by_digest(
    up: Up, builds: dict[str, str], tmp_path: Path
) -> None:
    with running_registry(tmp_path / "registry") as registry:
        push = f'[build]\npush = "{registry.address}/team/pushed"\n'
        app = site(tmp_path, "pushed", "from a registry\n", push)
        # The registry on loopback speaks plain HTTP: podman is told so for this push alone.
        conf = tmp_path / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{registry.address}"\ninsecure = true\n')
        out = deployed(deploy(up, {**builds, "CONTAINERS_REGISTRIES_CONF": str(conf)}, str(app)))
        pushed = re.search(rf"pushed ({re.escape(registry.address)}/team/pushed@sha256:\w+)", out)
        assert pushed is not None, out
        assert "sent" not in out  # nothing went to the control plane's upload
        assert page(up, "pushed") == "from a registry\n"
        versions = cli(up, "versions", "pushed").stdout
        assert versions.rstrip().endswith(f"Containerfile  {pushed.group(1)}")
