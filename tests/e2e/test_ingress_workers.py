"""`wakeful ingress --workers 2` among the pieces as processes on etcd: both workers serve on
one port, each a replica (its own lease channel and cache, metrics labelled by worker under
the supervisor's admin address); a killed worker's share goes to the other at once and the
worker is started again; SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from bench.procfs import children, gone
from tests.support.cluster import deploy, start_cluster
from wakeful.store.testing import EtcdServer, free_port

HOST = {"Host": "hello.localhost"}


def samples(admin: str, name: str) -> dict[str, float]:
    """`name`'s samples at the supervisor's /metrics, summed by worker."""
    text = httpx.get(f"http://{admin}/metrics", timeout=10).text
    by_worker: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'app="hello"' in line:
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            by_worker[worker] = by_worker.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return by_worker


def each_on_a_new_connection(proxy: str, count: int) -> list[int]:
    statuses = []
    for _ in range(count):
        with httpx.Client(base_url=proxy, timeout=30) as client:  # a new source port each
            statuses.append(client.get("/", headers=HOST).status_code)
    return statuses


def wait_for(what: str, check: object, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not callable(check) or not check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.2)


def test_two_workers_share_the_port_survive_a_kill_and_stop_together(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    admin = f"127.0.0.1:{free_port()}"
    role_env = {"ingress": {"WAKEFUL_INGRESS_WORKERS": "2", "WAKEFUL_ADMIN_LISTEN": admin}}
    processes: list[subprocess.Popen[str]] = []
    with start_cluster(
        etcd_server.url, tmp_path, nodes=("n1",), role_env=role_env, processes=processes
    ) as (api, proxy, env):
        supervisor = processes[-1]
        workers = children(supervisor.pid)
        assert len(workers) == 2, workers
        deploy(api, env)
        assert set(each_on_a_new_connection(proxy, 60)) == {200}
        answered = samples(admin, "wakeful_ingress_requests_total")
        assert set(answered) == {"0", "1"} and sum(answered.values()) == 60, answered
        assert httpx.get(f"http://{admin}/readyz", timeout=10).status_code == 200

        # Worker 0 dies: once it is gone, every new connection goes to the other.
        os.kill(workers[0], signal.SIGKILL)
        wait_for("the killed worker gone", lambda: gone(workers[0]))
        assert set(each_on_a_new_connection(proxy, 30)) == {200}
        # ... and it is started again, a replica like before.
        wait_for("a worker started again", lambda: len(children(supervisor.pid)) == 2)
        wait_for(
            "both workers ready",
            lambda: (
                "wakeful_ingress_workers_ready 2.0"
                in httpx.get(f"http://{admin}/metrics", timeout=10).text
            ),
        )
        metrics = httpx.get(f"http://{admin}/metrics", timeout=10).text
        assert 'wakeful_ingress_worker_restarts_total{worker="0"} 1.0' in metrics
        assert set(each_on_a_new_connection(proxy, 40)) == {200}

        now = children(supervisor.pid)
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=60)
        assert supervisor.returncode == 0
        assert all(gone(pid) for pid in now), now
