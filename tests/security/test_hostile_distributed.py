"""The hostile app (tests/security/hostile/app.py) in the multi-process mode: an activator, a
node agent and an ingress as separate processes on a real etcd, the node and the ingress with
tokens of their own roles. Every attempt must fail — reading the activator's environment (the
admin token) and the node agent's (its node token) included, and reaching etcd — while a second
app answers every probe, and nothing of the hostile sandbox outlives its deletion.

That each check can fail is shown under `wakeful up` with `--isolation=none`
(tests/security/test_hostile.py); this run is the isolated half in the other mode."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.cluster import make_token, piece_env
from tests.support.hostile import (
    ATTEMPTS,
    abstract_listener,
    processes_with,
    remove_written,
    write_hostile,
)
from tests.support.up import HELLO, WAKEFUL
from wakeful.node.testing import app_pids, sandbox_pids
from wakeful.store.testing import EtcdServer, free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-app uids and cgroups need root")


@dataclass
class Cluster:
    api: str
    proxy: str
    admin_port: int
    etcd_port: int
    env: dict[str, str]
    activator: subprocess.Popen[str]
    node: subprocess.Popen[str]
    node_dir: Path


@pytest.fixture
def cluster(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[Cluster]:
    api, proxy, admin = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": etcd_server.url,
        "WAKEFUL_STORE_NAMESPACE": f"/hostile-{uuid.uuid4().hex[:8]}/",
        "WAKEFUL_TOKEN": "hostile-admin-token",
        "WAKEFUL_API": f"http://127.0.0.1:{api}",
        "WAKEFUL_LEASE_TTL": "5",
    }
    node_dir = tmp_path / "n1"
    pieces = [
        ("activator", {"WAKEFUL_LISTEN": f"127.0.0.1:{api}"}),
        ("node", {"WAKEFUL_NODE_NAME": "n1", "WAKEFUL_DATA_DIR": str(node_dir)}),
        (
            "ingress",
            {"WAKEFUL_LISTEN": f"127.0.0.1:{proxy}", "WAKEFUL_ADMIN_LISTEN": f"127.0.0.1:{admin}"},
        ),
    ]
    started: dict[str, subprocess.Popen[str]] = {}
    try:
        for role, extra in pieces:
            command = [*WAKEFUL, "--data-dir", str(tmp_path / "act"), role]
            if role == "activator":
                piece = {**env, **extra}
            else:
                token = make_token(env, role, extra)
                piece = piece_env(env, {**extra, f"WAKEFUL_{role.upper()}_TOKEN": token})
            process = subprocess.Popen(
                command, env=piece, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            started[role] = process
            assert process.stdout is not None
            first = process.stdout.readline()  # each piece prints one line once it serves
            assert first.strip(), f"{role} did not start: {process.communicate()[0]}"
        etcd_port = int(etcd_server.url.rsplit(":", 1)[1])
        yield Cluster(
            f"http://127.0.0.1:{api}",
            f"http://127.0.0.1:{proxy}",
            admin,
            etcd_port,
            env,
            started["activator"],
            started["node"],
            node_dir,
        )
    finally:
        for process in reversed(started.values()):
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=30)
        assert not sandbox_pids(node_dir)


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WAKEFUL, "--api", cluster.api, *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def hello_port(node_dir: Path) -> int:
    for pid in app_pids(node_dir, "app.py"):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        values = dict(item.decode().partition("=")[::2] for item in environ if b"=" in item)
        if "MARKER" not in values:
            return int(values["PORT"])
    raise AssertionError("no hello sandbox runs")


async def test_every_attempt_fails_in_the_multi_process_mode(
    cluster: Cluster, tmp_path: Path
) -> None:
    marker = f"{random.randint(10**6, 10**7)}.{random.randint(1, 999)}"
    hello = tmp_path / "hello"
    shutil.copytree(HELLO, hello)
    assert cli(cluster, "deploy", str(hello)).returncode == 0
    failures = 0
    try:
        async with httpx.AsyncClient(base_url=cluster.proxy, timeout=120) as client:
            host = {"Host": "hello.localhost"}
            assert (await client.get("/", headers=host)).status_code == 200
            ports = {
                "the control API": int(cluster.api.rsplit(":", 1)[1]),
                "the ingress admin port": cluster.admin_port,
                "another app's port": hello_port(cluster.node_dir),
                "etcd": cluster.etcd_port,
            }
            hostile = write_hostile(
                tmp_path, cluster.node_dir, cluster.activator.pid, ports, marker
            )
            deployed = cli(cluster, "deploy", str(hostile))
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            stop = anyio.Event()

            async def probe() -> None:
                nonlocal failures
                while not stop.is_set():
                    failures += (await client.get("/", headers=host)).status_code != 200
                    await anyio.sleep(0.05)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(probe)
                with abstract_listener(marker):
                    answer = await client.get("/attack", headers={"Host": "hostile.localhost"})
                assert answer.status_code == 200, answer.text
                results = answer.json()
                grandchild = await client.get("/grandchild", headers={"Host": "hostile.localhost"})
                assert grandchild.status_code == 200
                stop.set()
        deleted = cli(cluster, "delete", "hostile")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        leftovers = await processes_with(marker, within=10)
    finally:
        remove_written(marker)
        for pid in await processes_with(marker, within=0):
            os.kill(pid, 9)
    done = {name: result for name, result in results.items() if result["done"]}
    assert done == {}
    assert set(ATTEMPTS) - {"connect to another app's port"} <= set(results)
    assert "connect to etcd" in results
    assert "hostile-admin-token" not in str(results)
    assert failures == 0
    assert leftovers == []
