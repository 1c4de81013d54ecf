"""docker-compose.yml, brought up by Debian's podman-compose as the README says: etcd, two
activators, two node agents, two ingresses behind haproxy, from wakeful's image and the infra
image (Debian's etcd-server and haproxy). From the host, through the published ports: the
control plane elects one leader, role tokens are made with `wakeful tokens create`, both nodes
register isolated, `wakeful deploy examples/hello` goes live, and hello answers through the
balancer. `podman-compose down -v` then leaves no container and no volume of the project.

Run alone: `.venv/bin/pytest tests/containers/test_compose.py` (root, podman, podman-compose).
"""

from __future__ import annotations

import random
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import httpx
import pytest

from tests.containers import podman
from wakeful.store.testing import free_port

pytestmark = pytest.mark.container

COMPOSE = podman.ROOT / "docker-compose.yml"
T = TypeVar("T")


class Stack:
    def __init__(self, project: str, env: dict[str, str]) -> None:
        self.project = project
        self.env = env

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

    def wakeful(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "wakeful.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"wakeful {args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def containers(self) -> list[str]:
        label = f"label=io.podman.compose.project={self.project}"
        listed = podman.podman("ps", "--all", "--filter", label, "--format", "{{.Names}}")
        return listed.stdout.split()

    def volumes(self) -> list[str]:
        listed = podman.podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
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
def stack(wakeful_image: str, infra_image: str) -> Iterator[Stack]:
    http, api1, api2 = free_port(), free_port(), free_port()
    admin = secrets.token_hex(32)
    env = {
        **podman.env(),
        "WAKEFUL_IMAGE": wakeful_image,
        "WAKEFUL_INFRA_IMAGE": infra_image,
        "WAKEFUL_HTTP_PORT": str(http),
        "WAKEFUL_API_PORT_1": str(api1),
        "WAKEFUL_API_PORT_2": str(api2),
        "WAKEFUL_ADMIN_TOKEN": admin,
        "WAKEFUL_API": f"http://127.0.0.1:{api1},http://127.0.0.1:{api2}",
        "WAKEFUL_TOKEN": admin,
    }
    for name in ("WAKEFUL_STORE_URL", "WAKEFUL_NODE_TOKEN", "WAKEFUL_INGRESS_TOKEN"):
        env.pop(name, None)
    stack = Stack(f"wakefultest{random.randint(10**5, 10**6)}", env)
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
        assert down.returncode == 0, down.stderr[-2000:]


def test_the_multi_process_mode_as_containers(stack: Stack) -> None:
    env = stack.env
    stack.compose("up", "-d", "etcd", "activator-1", "activator-2")
    api1, api2 = env["WAKEFUL_API"].split(",")
    leaders = wait(lambda: [url for url in (api1, api2) if ready(url)], "an activator leads", stack)
    assert len(leaders) == 1, leaders  # one leads, the other stands by

    env["WAKEFUL_NODE_TOKEN"] = stack.wakeful(
        "tokens", "create", "--role", "node", "--name", "compose-nodes"
    ).strip()
    env["WAKEFUL_INGRESS_TOKEN"] = stack.wakeful(
        "tokens", "create", "--role", "ingress", "--name", "compose-ingresses"
    ).strip()
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
    status = stack.wakeful("status", "hello")
    assert "hello-v1" in status, status

    containers = stack.containers()
    assert len(containers) == 8, containers
    down = stack.compose("down", "-v")
    assert stack.containers() == [], down
    assert stack.volumes() == [], down


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
