"""The pieces as separate processes on a real etcd: activator, node agents and an ingress,
each node and the ingress with a token of its own role, and the CLI with the admin token."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import (
    deploy,
    start_cluster,
    wakeful_logs,
)
from tests.support.up import WAKEFUL
from wakeful.store.testing import EtcdServer


@pytest.fixture
def cluster(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    with start_cluster(etcd_server.url, tmp_path) as started:
        yield started


def test_separate_pieces_deploy_and_serve_through_etcd(
    cluster: tuple[str, str, dict[str, str]],
) -> None:
    api, proxy, env = cluster
    deployed = deploy(api, env)
    assert "live" in deployed.stdout
    answer = httpx.get(f"{proxy}/", headers={"Host": "hello.localhost"}, timeout=60)
    assert answer.status_code == 200, answer.text
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
    # The sandbox's output is on its node's disk only; the node pushes it to the control
    # plane, and `wakeful logs` reads it there (the node ships about once a second).
    deadline = time.monotonic() + 30
    while True:
        logs = wakeful_logs(api, env, "hello")
        assert logs.returncode == 0, logs.stderr
        if "hello listening" in logs.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lines = logs.stdout.splitlines()
    assert lines, logs.stderr
    assert all(
        re.fullmatch(r"\S+Z \[[a-z0-9-]+\] hello listening on 127\.0\.0\.1:\d+", x) for x in lines
    )
    unknown = wakeful_logs(api, env, "nope")
    assert unknown.returncode != 0
    assert "no app named 'nope'" in unknown.stderr


def test_draining_a_node_moves_its_sandboxes_without_failing_a_request(
    cluster: tuple[str, str, dict[str, str]],
) -> None:
    api, proxy, env = cluster
    deploy(api, env)
    headers = {"Host": "hello.localhost"}
    with httpx.Client(base_url=proxy, timeout=60) as client:
        assert client.get("/", headers=headers).status_code == 200
        nodes = httpx.get(f"{api}/v1/nodes", headers={"Authorization": "Bearer distributed-token"})
        busy = next(n["name"] for n in nodes.json() if n["sandboxes"] == 1)
        drain = subprocess.Popen(
            [*WAKEFUL, "--api", api, "drain", busy],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        statuses = []
        while drain.poll() is None:  # requests all through the move
            statuses.append(client.get("/", headers=headers).status_code)
        output = drain.communicate(timeout=60)[0]
        assert drain.returncode == 0, output
        statuses.append(client.get("/", headers=headers).status_code)
    assert set(statuses) == {200}
    nodes = httpx.get(f"{api}/v1/nodes", headers={"Authorization": "Bearer distributed-token"})
    by_name = {n["name"]: n for n in nodes.json()}
    assert by_name[busy]["evacuating"] and by_name[busy]["sandboxes"] == 0
    other = next(name for name in by_name if name != busy)
    assert by_name[other]["sandboxes"] == 1
