"""The pieces as separate processes on a real etcd: activator, node agent, ingress, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from store.testing import EtcdServer, free_port

HELLO = Path(__file__).parents[2] / "examples" / "hello"
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


@pytest.fixture
def cluster(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    api = f"127.0.0.1:{free_port()}"
    proxy = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "WAKEFUL_STORE_URL": etcd_server.url,
        "WAKEFUL_STORE_NAMESPACE": f"/dist-{uuid.uuid4().hex[:8]}/",
        "WAKEFUL_TOKEN": "distributed-token",
        "WAKEFUL_API": f"http://{api}",
    }
    pieces = [
        ([*WAKEFUL, "--data-dir", str(tmp_path / "act"), "activator"], {"WAKEFUL_LISTEN": api}),
        (
            [*WAKEFUL, "node"],
            {"WAKEFUL_NODE_NAME": "n1", "WAKEFUL_DATA_DIR": str(tmp_path / "n1")},
        ),
        (
            [*WAKEFUL, "ingress"],
            {"WAKEFUL_LISTEN": proxy, "WAKEFUL_ADMIN_LISTEN": f"127.0.0.1:{free_port()}"},
        ),
    ]
    processes = []
    try:
        for command, extra in pieces:
            process = subprocess.Popen(
                command,
                env={**env, **extra},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            processes.append(process)
            assert process.stdout is not None
            first = process.stdout.readline()  # each piece prints one line once it serves
            assert first.strip(), f"{command[-1]} did not start: {process.communicate()[0]}"
        yield f"http://{api}", f"http://{proxy}", env
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=30)


def test_separate_pieces_deploy_and_serve_through_etcd(
    cluster: tuple[str, str, dict[str, str]],
) -> None:
    api, proxy, env = cluster
    deployed = subprocess.run(
        [*WAKEFUL, "--api", api, "deploy", str(HELLO)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "live" in deployed.stdout
    answer = httpx.get(f"{proxy}/", headers={"Host": "hello.localhost"}, timeout=60)
    assert answer.status_code == 200
    assert answer.text.startswith("hello from")
    status = subprocess.run(
        [*WAKEFUL, "--api", api, "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert '"ready": 1' in status.stdout
