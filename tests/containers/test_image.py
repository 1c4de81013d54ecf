"""The image, built by podman from the repository's Dockerfile and run as the README says.

- Run as it is, it refuses to start apps unisolated by surprise: the container lacks what
  sandboxes need, and the refusal names the flags that give it, and `WAKEFUL_ISOLATION=none`.
- With the least privilege the README gives (`podman.LEAST_PRIVILEGE`), `wakeful up` in it
  serves `hello` through the published port from the host, its HEALTHCHECK passes, every
  sandbox is isolated as on a host (own uid, network fenced), and a hostile app deployed from
  the host through the published control API reaches none of the control plane's files,
  processes or ports. `podman stop` (SIGTERM) then ends wakeful by itself (exit 0, no SIGKILL),
  every sandbox stopped, and no process of the container is left on the host.
- With `WAKEFUL_ISOLATION=none` and no extra privilege, it serves `hello`.

Run alone: `.venv/bin/pytest tests/containers` (root, Debian's podman; `scripts/test` installs
it). The first run makes the base image (~1 minute) and builds the image (~1 minute).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.containers import podman
from tests.security.test_hostile import write_hostile
from wakeful.store.testing import free_port

pytestmark = pytest.mark.container

HELLO = {"host": "hello.localhost"}
MUST_FAIL = (
    "read the token file",
    "read store.db",
    "read the control plane's environ",
    "signal the control plane",
    "write outside its directory",
    "fork past `processes`",
    "allocate past `memory`",
    "fill the disk",
    "create a user namespace",
    "connect to the control API",
    "connect to the ingress admin port",
)


def name(what: str) -> str:
    return f"wakeful-test-{what}-{random.randint(10**5, 10**6)}"


def test_refuses_to_run_apps_without_the_privileges_sandboxes_need(wakeful_image: str) -> None:
    with podman.container(name("refused"), [wakeful_image]) as box:
        stopped = podman.wait_exited(box)
        said = podman.logs(box)
    assert stopped["ExitCode"] != 0, said
    assert "bwrap cannot make a sandbox here" in said, said
    assert "--cap-add SYS_ADMIN,NET_ADMIN" in said, said
    assert "WAKEFUL_ISOLATION=none" in said, said


def test_unisolated_when_asked_with_no_extra_privilege(wakeful_image: str) -> None:
    port = free_port()
    args = ["-p", f"127.0.0.1:{port}:8080", "-e", "WAKEFUL_ISOLATION=none", wakeful_image]
    with podman.container(name("none"), args) as box:
        answer = podman.wait_for(f"http://127.0.0.1:{port}/", HELLO["host"])
        assert answer.text.startswith("hello from"), answer.text
        nodes = podman.podman("exec", box, "wakeful", "nodes").stdout
        assert "isolation: none" in nodes, nodes


def test_isolated_in_the_container_and_stopped_clean(wakeful_image: str, tmp_path: Path) -> None:
    podman.subordinate_ids()
    port, api = free_port(), free_port()
    volume = name("data")
    args = [
        "-v",
        f"{volume}:/data",
        *podman.LEAST_PRIVILEGE,
        "-p",
        f"127.0.0.1:{port}:8080",
        "-p",
        f"127.0.0.1:{api}:8082",
        wakeful_image,
    ]
    with podman.volume(volume), podman.container(name("isolated"), args) as box:
        answer = podman.wait_for(f"http://127.0.0.1:{port}/", HELLO["host"])
        assert answer.text.startswith("hello from"), answer.text
        nodes = podman.podman("exec", box, "wakeful", "nodes").stdout
        assert "own uid per app" in nodes, nodes
        assert "network not isolated" not in nodes, nodes
        health = podman.podman("healthcheck", "run", box, check=False)
        assert health.returncode == 0, health.stdout + health.stderr

        # A hostile app, deployed from the host through the published control API.
        token = podman.podman("exec", box, "cat", "/data/.wakeful/token").stdout.strip()
        ports = {"the control API": 8082, "the ingress admin port": 8081}
        marker = str(random.randint(10**6, 10**7))
        hostile = write_hostile(tmp_path, Path("/data/.wakeful"), wakeful_pid(box), ports, marker)
        deployed = subprocess.run(
            [sys.executable, "-m", "wakeful.cli", "deploy", str(hostile)],
            env={**podman.env(), "WAKEFUL_API": f"http://127.0.0.1:{api}", "WAKEFUL_TOKEN": token},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        attack = httpx.get(
            f"http://127.0.0.1:{port}/attack", headers={"host": "hostile.localhost"}, timeout=180
        )
        assert attack.status_code == 200, attack.text
        results = attack.json()
        table = json.dumps(results, indent=1)
        print(table)
        for attempt in MUST_FAIL:
            assert attempt in results, table
            assert results[attempt]["done"] is False, f"{attempt} succeeded:\n{table}"
        assert podman.wait_for(f"http://127.0.0.1:{port}/", HELLO["host"]).status_code == 200

        container_id = str(podman.podman("inspect", "--format", "{{.Id}}", box).stdout.strip())
        assert podman.host_processes_of(container_id), "no process of the container found"
        podman.podman("stop", "--time", "60", box, timeout=120)
        stopped = podman.state(box)
        said = podman.logs(box)
        assert stopped["ExitCode"] == 0, f"{stopped}\n{said[-3000:]}"  # 137: SIGKILLed
        assert "stopping (SIGTERM)" in said, said[-3000:]
        assert podman.host_processes_of(container_id) == []


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
