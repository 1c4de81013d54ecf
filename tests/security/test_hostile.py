"""A hostile app under `wakeful up` (tests/security/hostile/app.py): every attempt on the
control plane must fail or be contained, while a second app keeps serving, and nothing of the
hostile sandbox is left after it stops. The same app run with `--isolation=none` shows that
each check can fail: there, every attempt succeeds.

Run alone: `.venv/bin/pytest tests/security` (needs root for the per-app uid and cgroups,
and Debian's bubblewrap; scripts/test installs it)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.hostile import (
    ATTEMPTS,
    abstract_listener,
    as_image,
    processes_with,
    remove_written,
    write_hostile,
    written_outside,
)
from tests.support.up import Up, cli_async, make_app, start_up, stop_up
from wakeful.node.testing import app_pids, sandbox_pids

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="per-app uids and cgroups need root"),
    pytest.mark.anyio,
]
MACHINE_DEPENDENT = {"read /proc/1/environ"}
"""Where pid 1 is itself confined (a container's init), even root cannot read its environ."""


@dataclass
class Attack:
    results: dict[str, dict[str, object]]
    failures: int
    """Requests to the second app that failed while the attack ran."""
    leftovers: list[int]
    """Processes of the hostile sandbox still alive after it stopped."""
    token: str
    written: list[str]
    """Files it wrote outside its directory, on this machine (not in its own root)."""


def hostile_app(root: Path, up: Up, marker: str, hello_port: int) -> Path:
    api_port = up.api.rsplit(":", 1)[1]
    admin_port = up.admin.rsplit(":", 1)[1]
    ports = {
        "the control API": int(api_port),
        "the ingress admin port": int(admin_port),
        "another app's port": hello_port,
    }
    return write_hostile(root, up.data_dir, up.process.pid, ports, marker)


async def attack(tmp_path: Path, *flags: str, image: bool = False) -> Attack:
    """`image`: the hostile app runs from an OCI image (issue 36) instead of a directory."""
    up = start_up(tmp_path, make_app(tmp_path, "hello"), flags=flags)
    marker = f"{random.randint(10**6, 10**7)}.{random.randint(1, 999)}"
    failures = 0
    try:
        # A secret of hello's (issue 35), which its sandbox has in its environment.
        secret = await cli_async(up, "secrets", "set", "hello", f"HELLO_SECRET={marker}")
        assert secret.returncode == 0, secret.stdout + secret.stderr
        async with httpx.AsyncClient(base_url=up.proxy, timeout=120) as client:
            assert (await client.get("/", headers=up.host("hello"))).status_code == 200
        await secret_in_every_hello(up, marker)
        hostile = hostile_app(tmp_path, up, marker, hello_port(up))
        if image:
            as_image(hostile)
        deployed = await cli_async(up, "deploy", str(hostile))
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        async with httpx.AsyncClient(base_url=up.proxy, timeout=120) as client:
            stop = anyio.Event()

            async def probe() -> None:
                nonlocal failures
                while not stop.is_set():
                    answer = await client.get("/", headers=up.host("hello"))
                    failures += answer.status_code != 200
                    await anyio.sleep(0.05)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(probe)
                with abstract_listener(marker):
                    answer = await client.get("/attack", headers=up.host("hostile"))
                assert answer.status_code == 200, answer.text
                results = answer.json()
                started = await client.get("/grandchild", headers=up.host("hostile"))
                assert started.status_code == 200
                stop.set()
        written = written_outside(up.data_dir, marker)
        stopped = await cli_async(up, "delete", "hostile")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        leftovers = await processes_with(marker, within=10)
        return Attack(results, failures, leftovers, up.token, written)
    finally:
        remove_written(marker)
        for pid in await processes_with(marker, within=0):  # never leave one behind
            os.kill(pid, 9)
        stop_up(up)
        assert not sandbox_pids(up.data_dir)


def environ(pid: int) -> dict[str, str]:
    """A process's environment (we are root)."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in env if b"=" in item)


async def secret_in_every_hello(up: Up, marker: str) -> None:
    """Until hello runs only sandboxes started with its secret (the set replaces the others)."""
    with anyio.fail_after(60):
        while True:
            try:
                envs = [environ(pid) for pid in app_pids(up.data_dir, "app.py")]
            except OSError:  # one ended as we read it
                envs = []
            if envs and all(env.get("HELLO_SECRET") == marker for env in envs):
                return
            await anyio.sleep(0.1)


def hello_port(up: Up) -> int:
    """The port the running hello sandbox listens on, from its environment (we are root)."""
    for pid in app_pids(up.data_dir, "app.py"):
        values = environ(pid)
        if "MARKER" not in values:
            return int(values["PORT"])
    raise AssertionError("no hello sandbox runs")


# Async fixtures, on the session's loop (tests/conftest.py): anyio.run would find it running.
@pytest.fixture(scope="module")
async def isolated(tmp_path_factory: pytest.TempPathFactory) -> Attack:
    return await attack(tmp_path_factory.mktemp("isolated"))


@pytest.fixture(scope="module")
async def from_image(tmp_path_factory: pytest.TempPathFactory) -> Attack:
    return await attack(tmp_path_factory.mktemp("image"), image=True)


@pytest.fixture(scope="module")
async def unisolated(tmp_path_factory: pytest.TempPathFactory) -> Attack:
    return await attack(tmp_path_factory.mktemp("unisolated"), "--isolation=none")


@pytest.mark.parametrize("name", ATTEMPTS)
def test_each_attempt_fails_under_isolation_and_succeeds_without(
    name: str, isolated: Attack, unisolated: Attack
) -> None:
    if name not in MACHINE_DEPENDENT:
        assert unisolated.results[name]["done"], unisolated.results[name]  # it can fail
    assert not isolated.results[name]["done"], isolated.results[name]
    assert isolated.token not in str(isolated.results[name]["detail"])


IN_ITS_OWN_ROOT = {"write outside its directory"}
"""An image app's root is its own (an overlay in its bounded tmpfs): it may write /etc there.
What counts is what reached this machine (`Attack.written`)."""


@pytest.mark.parametrize("name", ATTEMPTS)
def test_an_app_from_an_image_gets_nothing_it_gets_as_a_directory_app(
    name: str, from_image: Attack
) -> None:
    if name not in IN_ITS_OWN_ROOT:
        assert not from_image.results[name]["done"], from_image.results[name]
    assert from_image.token not in str(from_image.results[name]["detail"])
    assert from_image.written == []


def test_nothing_of_the_image_sandbox_is_left_and_the_other_app_served(
    from_image: Attack,
) -> None:
    assert from_image.leftovers == []
    assert from_image.failures == 0


def test_the_other_app_kept_serving_throughout(isolated: Attack, unisolated: Attack) -> None:
    assert isolated.failures == 0
    assert unisolated.failures == 0


def test_no_process_of_the_hostile_sandbox_is_left(isolated: Attack, unisolated: Attack) -> None:
    assert isolated.leftovers == []
    assert unisolated.leftovers != []  # a setsid grandchild escapes a process-group kill


def test_the_table_for_the_closing_note(isolated: Attack, unisolated: Attack) -> None:
    """Prints attempt | without isolation | with isolation (run with -s to see it)."""
    rows = [f"| {name} | {cell(unisolated, name)} | {cell(isolated, name)} |" for name in ATTEMPTS]
    print("\n| attempt | without isolation | with isolation |\n|---|---|---|\n" + "\n".join(rows))
    assert len(rows) == len(ATTEMPTS)


def cell(result: Attack, name: str) -> str:
    found = result.results[name]
    state = "**succeeded**" if found["done"] else "failed"
    return f"{state}: {str(found['detail'])[:70]}".replace("|", "/").replace("\n", " ")
