"""The image, built by podman from the repository's Dockerfile and run as the README says.

- Run as it is, it refuses to start apps unisolated by surprise: the container lacks what
  sandboxes need, and the refusal names the flags that give it, and `WAKEFUL_ISOLATION=none`.
- With `WAKEFUL_ISOLATION=none` and no extra privilege it serves `hello`, and the security
  suite's hostile app, deployed from the host, gets what it attempts (the control run: each
  attempt below aims where it should, so its failing under isolation means something).
- With the least privilege the README gives (`podman.LEAST_PRIVILEGE`) and a volume, `wakeful
  up` serves `hello` through the published port, its HEALTHCHECK passes, every sandbox is
  isolated as on a host (own uid, network fenced), and the same hostile app fails every
  attempt. `podman stop` (SIGTERM) then ends wakeful by itself (exit 0, not SIGKILL's 137)
  after it stopped every sandbox: an app that reports its SIGTERM to the test (over the
  container network's gateway, a listener of the test's) reported it. A sandbox killed with
  the container's PID namespace gets SIGKILL, and would not have.

Run alone: `.venv/bin/pytest tests/containers` (root, Debian's podman; `scripts/test` installs
it; `-s` prints the hostile app's attempts). The first run makes the base image (~1 minute)
and builds the images (~1 minute).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support import podman
from tests.support.hostile import write_hostile
from wakeful.store.testing import free_port

pytestmark = pytest.mark.container

HELLO = "hello.localhost"
AIMED = (
    "read the token file",
    "read store.db",
    "read the control plane's environ",
    "signal the control plane",
    "connect to the control API",
    "connect to the ingress admin port",
    "connect to the host through the gateway",
)
"""What the hostile app gets unisolated: where it aims is right."""
MUST_FAIL = (
    *AIMED,
    "read /proc/1/environ",
    "read its parent's environ",
    "read another app's files",
    "write outside its directory",
    "fork past `processes`",
    "allocate past `memory`",
    "fill the disk",
    "create a user namespace",
)
STOP_MARK = b"wakeful-test: SIGTERM received"
STOPPING_APP = f"""\
import os, signal, socket, sys
from http.server import BaseHTTPRequestHandler, HTTPServer


def stop(signum, frame):
    host, port = os.environ["REPORT"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as told:
        told.sendall({STOP_MARK!r})
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
"""


def name(what: str) -> str:
    return f"wakeful-test-{what}-{random.randint(10**5, 10**6)}"


def test_runs_the_compiled_exchange_and_carries_no_compiler(wakeful_image: str) -> None:
    """The build stage compiles the ingress (mypyc); the image runs that, not its pure-Python
    twin, and keeps neither the compiler nor mypy."""
    script = (
        "import importlib.util as u, shutil, wakeful, wakeful.ingress.edge as e;"
        "print(wakeful.NATIVE, e.__file__.endswith('.so'), u.find_spec('mypy') is None,"
        " shutil.which('gcc') is None)"
    )
    python = ["--entrypoint", "/opt/wakeful/bin/python", wakeful_image, "-c", script]
    said = podman.podman("run", "--rm", *python).stdout.split()
    assert said == ["compiled", "True", "True", "True"], said


def test_refuses_to_run_apps_without_the_privileges_sandboxes_need(wakeful_image: str) -> None:
    with podman.container(name("refused"), [wakeful_image]) as box:
        stopped = podman.wait_exited(box)
        said = podman.logs(box)
    assert stopped["ExitCode"] != 0, said
    assert "bwrap cannot make a sandbox here" in said, said
    assert "--cap-add SYS_ADMIN,NET_ADMIN" in said, said
    assert "WAKEFUL_ISOLATION=none" in said, said


@pytest.mark.parametrize("missing", podman.CAPABILITIES)
def test_refuses_without_any_one_capability_naming_it(wakeful_image: str, missing: str) -> None:
    """Without one of the nine, apps would run less isolated than the agent reports (no
    network fence, a bounding set kept) or fail at every start: it refuses at once, naming
    what is missing (without DAC_OVERRIDE, root cannot open the volume: said so)."""
    podman.subordinate_ids()
    flags = list(podman.LEAST_PRIVILEGE)
    caps = flags.index("--cap-add") + 1
    flags[caps] = ",".join(c for c in podman.CAPABILITIES if c != missing)
    with podman.container(name("without"), [*flags, wakeful_image]) as box:
        stopped = podman.wait_exited(box)
        logs = podman.logs(box)
    assert stopped["ExitCode"] != 0, logs
    if missing == "DAC_OVERRIDE":
        assert "--data-dir /data/.wakeful: cannot create it: Permission denied" in logs, logs
    else:
        assert f"the container lacks {missing}, which sandboxes need" in logs, logs
        assert "--cap-add SYS_ADMIN,NET_ADMIN" in logs, logs


def test_unisolated_when_asked_with_no_extra_privilege(wakeful_image: str, tmp_path: Path) -> None:
    port, api = free_port(), free_port()
    args = [
        *published(port, api),
        "-e",
        "WAKEFUL_ISOLATION=none",
        wakeful_image,
    ]
    with podman.container(name("none"), args) as box:
        answer = podman.wait_for(f"http://127.0.0.1:{port}/", HELLO)
        assert answer.text.startswith("hello from"), answer.text
        nodes = podman.podman("exec", box, "wakeful", "nodes").stdout
        assert "isolation: none" in nodes, nodes
        results = attack(box, port, api, tmp_path)
    table = json.dumps(results, indent=1)
    for attempt in AIMED:
        assert results[attempt]["done"] is True, f"{attempt} failed unisolated:\n{table}"


def test_isolated_in_the_container_and_stopped_clean(wakeful_image: str, tmp_path: Path) -> None:
    podman.subordinate_ids()
    port, api = free_port(), free_port()
    volume = name("data")
    args = [
        "-v",
        f"{volume}:/data:U",
        *podman.LEAST_PRIVILEGE,
        *published(port, api),
        wakeful_image,
    ]
    with podman.volume(volume), podman.container(name("isolated"), args) as box:
        answer = podman.wait_for(f"http://127.0.0.1:{port}/", HELLO)
        assert answer.text.startswith("hello from"), answer.text
        nodes = podman.podman("exec", box, "wakeful", "nodes").stdout
        assert "own uid per app" in nodes, nodes
        assert "network not isolated" not in nodes, nodes
        health = podman.podman("healthcheck", "run", box, check=False)
        assert health.returncode == 0, health.stdout + health.stderr

        results = attack(box, port, api, tmp_path)
        table = json.dumps(results, indent=1)
        for attempt in MUST_FAIL:
            assert attempt in results, table
            assert results[attempt]["done"] is False, f"{attempt} succeeded:\n{table}"
        assert podman.wait_for(f"http://127.0.0.1:{port}/", HELLO).status_code == 200

        with podman.listener(podman.host_address()) as (reported, address):
            stopping = tmp_path / "stopping"
            stopping.mkdir()
            (stopping / "app.py").write_text(STOPPING_APP)
            (stopping / "wakeful.toml").write_text(
                'name = "stopping"\ncommand = ["python3", "app.py"]\nshutdown_timeout = 20\n'
                f'[env]\nREPORT = "{address}"\n'
            )
            deploy(box, api, stopping)
            assert podman.wait_for(f"http://127.0.0.1:{port}/", "stopping.localhost").text == "ok"

            podman.podman("stop", "--time", "60", box, timeout=120)
            stopped = podman.state(box)
            said = podman.logs(box)
            assert stopped["ExitCode"] == 0, f"{stopped}\n{said[-3000:]}"  # 137: SIGKILLed
            assert "stopping (SIGTERM)" in said, said[-3000:]
            assert reported() == STOP_MARK  # wakeful stopped the sandbox with SIGTERM


def published(port: int, api: int) -> list[str]:
    return ["-p", f"127.0.0.1:{port}:8080", "-p", f"127.0.0.1:{api}:8082"]


def deploy(box: str, api: int, app: Path) -> None:
    """`wakeful deploy` from the host, through the published control API."""
    token = podman.podman("exec", box, "cat", "/data/.wakeful/token").stdout.strip()
    deployed = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", "deploy", str(app)],
        env={**podman.env(), "WAKEFUL_API": f"http://127.0.0.1:{api}", "WAKEFUL_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr


def attack(box: str, port: int, api: int, tmp_path: Path) -> dict[str, dict[str, object]]:
    """The security suite's hostile app, deployed from the host and asked to attack: its
    table of attempts (printed, for `-s`)."""
    with podman.listener(podman.gateway()) as (_, on_host):
        ports: dict[str, int | str] = {
            "the control API": 8082,
            "the ingress admin port": 8081,
            "the host through the gateway": on_host,  # host.containers.internal
        }
        marker = str(random.randint(10**6, 10**7))
        data_dir = Path("/data/.wakeful")
        hostile = write_hostile(tmp_path, data_dir, wakeful_pid(box), ports, marker)
        deploy(box, api, hostile)
        answer = httpx.get(
            f"http://127.0.0.1:{port}/attack", headers={"host": "hostile.localhost"}, timeout=180
        )
    assert answer.status_code == 200, answer.text
    results: dict[str, dict[str, object]] = answer.json()
    print(json.dumps(results, indent=1))
    return results


def wakeful_pid(box: str) -> int:
    """wakeful's pid inside the container (tini is 1): what the hostile app tries to signal."""
    script = (
        "import os\n"
        "for p in sorted(int(d) for d in os.listdir('/proc') if d.isdigit()):\n"
        "    cmd = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
        "    if any(c.endswith(b'/wakeful') for c in cmd[:2]) and b'up' in cmd:\n"
        "        print(p); break\n"
    )
    found = podman.podman("exec", box, "python3", "-c", script).stdout.strip()
    assert found.isdigit(), found
    return int(found)
