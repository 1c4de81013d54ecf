"""docker-compose.yml, brought up by Debian's podman-compose as the README says: etcd, two
activators, two node agents, two ingresses behind haproxy, from wakeful's image and the infra
image (Debian's etcd-server and haproxy). From the host, through the published ports: the
control plane elects one leader, role tokens are made with `wakeful tokens create` and go
into the secrets files (never onto a command line podman-compose prints), both nodes register
isolated, each with its own part of the sandbox uids, `wakeful deploy examples/hello` goes
live, and hello answers through the balancer from both ingresses. `podman-compose down -v`
(and removing the network podman-compose 1.0.3 leaves) then leaves no container, volume or
network behind.

Run alone: `.venv/bin/pytest tests/containers/test_compose.py` (root, podman, podman-compose).
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tests.support import podman
from wakeful.store.testing import free_port

pytestmark = pytest.mark.container

COMPOSE = podman.ROOT / "docker-compose.yml"
T = TypeVar("T")


class Stack:
    def __init__(self, project: str, env: dict[str, str], secrets: Path) -> None:
        self.project = project
        self.env = env
        self.secrets = secrets
        self.said = ""
        """Everything podman-compose printed: no token may be in it."""

    def secret(self, file: str, name: str, value: str) -> None:
        (self.secrets / file).write_text(f"{name}={value}\n")

    def compose(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            ["podman-compose", "-f", str(COMPOSE), "-p", self.project, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, (
            f"podman-compose {args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def run_wakeful(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wakeful.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def wakeful(self, *args: str, timeout: float = 180) -> str:
        done = self.run_wakeful(*args, timeout=timeout)
        assert done.returncode == 0, f"wakeful {args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def containers(self) -> list[str]:
        label = f"label=io.podman.compose.project={self.project}"
        listed = podman.podman("ps", "--all", "--filter", label, "--format", "{{.Names}}")
        return listed.stdout.split()

    def volumes(self) -> list[str]:
        listed = podman.podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
        return [name for name in listed if name.startswith(f"{self.project}_")]

    def network(self) -> list[str]:
        listed = podman.podman("network", "ls", "--format", "{{.Name}}").stdout.split()
        return [name for name in listed if name.startswith(f"{self.project}_")]

    def logs(self) -> str:
        return "\n".join(f"== {name}\n{podman.logs(name)[-1500:]}" for name in self.containers())


@pytest.fixture(scope="module")
def infra_image(wakeful_image: str) -> str:
    """Built beside wakeful's image (`podman.build_images`)."""
    if shutil.which("podman-compose") is None:
        pytest.skip("podman-compose is not installed (scripts/test installs Debian's)")
    return podman.INFRA_IMAGE


@pytest.fixture
def stack(wakeful_image: str, infra_image: str, tmp_path: Path) -> Iterator[Stack]:
    http, api1, api2 = free_port(), free_port(), free_port()
    admin = secrets.token_hex(32)
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    env = {
        **podman.env(),
        "WAKEFUL_IMAGE": wakeful_image,
        "WAKEFUL_INFRA_IMAGE": infra_image,
        "WAKEFUL_HTTP_PORT": str(http),
        "WAKEFUL_API_PORT_1": str(api1),
        "WAKEFUL_API_PORT_2": str(api2),
        "WAKEFUL_COMPOSE_SECRETS": str(folder),
        "WAKEFUL_API": f"http://127.0.0.1:{api1},http://127.0.0.1:{api2}",
        "WAKEFUL_TOKEN": admin,
    }
    for name in ("WAKEFUL_STORE_URL", "WAKEFUL_NODE_TOKEN", "WAKEFUL_INGRESS_TOKEN", "container"):
        env.pop(name, None)
    stack = Stack(f"wakefultest{random.randint(10**5, 10**6)}", env, folder)
    stack.secret("admin.env", "WAKEFUL_TOKEN", admin)
    try:
        yield stack
    finally:
        down = subprocess.run(
            ["podman-compose", "-f", str(COMPOSE), "-p", stack.project, "down", "-v"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for name in stack.containers():  # never leave one behind, whatever failed
            podman.podman("rm", "--force", "--time", "0", name, check=False)
        for name in stack.volumes():
            podman.podman("volume", "rm", "--force", name, check=False)
        for name in stack.network():
            podman.podman("network", "rm", "--force", name, check=False)
        assert down.returncode == 0, down.stderr[-2000:]


def test_the_multi_process_mode_as_containers(stack: Stack) -> None:
    env = stack.env
    stack.compose("up", "-d", "etcd", "activator-1", "activator-2")
    api1, api2 = env["WAKEFUL_API"].split(",")
    leaders = wait(lambda: [url for url in (api1, api2) if ready(url)], "an activator leads", stack)
    assert len(leaders) == 1, leaders  # one leads, the other stands by

    nodes_tokens = []
    for node in ("node-1", "node-2"):  # a node token pushes only its own node's logs
        made = stack.wakeful("tokens", "create", "--role", "node", "--name", node).strip()
        stack.secret(f"{node}.env", "WAKEFUL_NODE_TOKEN", made)
        nodes_tokens.append(made)
    edge = stack.wakeful("tokens", "create", "--role", "ingress", "--name", "compose-ingresses")
    stack.secret("ingress.env", "WAKEFUL_INGRESS_TOKEN", edge.strip())
    stack.compose("up", "-d")

    def both_nodes() -> str | None:
        nodes = stack.wakeful("nodes")
        ready_isolated = [
            line for line in nodes.splitlines() if " ready " in line and "own uid per app" in line
        ]
        return nodes if len(ready_isolated) == 2 else None

    nodes = wait(both_nodes, "both nodes ready and isolated", stack)
    assert "network not isolated" not in nodes, nodes

    deployed = stack.wakeful("deploy", str(podman.ROOT / "examples" / "hello"))
    assert "is live" in deployed, deployed
    url = f"http://127.0.0.1:{env['WAKEFUL_HTTP_PORT']}/"
    first = podman.wait_for(url, "hello.localhost", within=120)
    assert first.text.startswith("hello from"), first.text
    for _ in range(20):  # round robin over both ingresses: every answer a 200
        answer = httpx.get(url, headers={"host": "hello.localhost"}, timeout=30)
        assert answer.status_code == 200, answer.text
    for ingress in ("ingress-1", "ingress-2"):  # both served some
        assert answered(stack, ingress) > 0, ingress
    status = stack.wakeful("status", "hello")
    assert "hello-v1" in status, status
    for token in (env["WAKEFUL_TOKEN"], *nodes_tokens, edge.strip()):
        assert token not in stack.said
    logs = stack.run_wakeful("logs", "hello", "--tail", "5")
    assert logs.returncode == 0 and "behind" not in logs.stderr, logs.stderr

    containers = stack.containers()
    assert len(containers) == 8, containers
    # Every volume a container holds is one the compose file names (an unnamed one, as the
    # image's VOLUME /data makes, would outlive `down -v`).
    for box in containers:
        found = json.loads(podman.podman("inspect", "--type", "container", box).stdout)
        for mount in found[0]["Mounts"]:
            if mount["Type"] == "volume":
                assert mount["Name"].startswith(f"{stack.project}_"), (box, mount)
    assert len(stack.volumes()) == 9  # etcd, artifacts, secret keys, and each piece's /data
    down = stack.compose("down", "-v")
    assert stack.containers() == [], down
    assert stack.volumes() == [], down


def answered(stack: Stack, service: str) -> float:
    """Requests an ingress answered, from its own /metrics (inside its container)."""
    script = (
        "import urllib.request as u\n"
        "text = u.urlopen('http://127.0.0.1:8081/metrics', timeout=5).read().decode()\n"
        "print(sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()\n"
        "          if line.startswith('wakeful_ingress_requests_total{')))\n"
    )
    name = f"{stack.project}_{service}_1"
    return float(podman.podman("exec", name, "python3", "-c", script).stdout.strip())


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait(probe: Callable[[], T | None], what: str, stack: Stack, within: float = 120) -> T:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {within} s\n{stack.logs()}")
