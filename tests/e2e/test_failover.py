"""Two activators on one etcd (invariant 20): the leader killed under load, the standby takes
over, and a user sees at worst a slower answer.

A prober asks a warm app all along; once the leader is SIGKILLed, the standby is elected
after the leader's election TTL (2 s here), adopts the leases the ingress reports holding, and
then serves the control API and grants leases: a cold app asked the moment the leader died
wakes through it (the ingress makes its acquire again there)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import deploy, leads, start_cluster
from tests.support.prober import Prober
from tests.support.up import HELLO, WAKEFUL
from wakeful.store.testing import EtcdServer

ADMIN = {"Authorization": "Bearer distributed-token"}


def _cold_app(tmp_path: Path) -> Path:
    """The sample app under another name, deployed and never asked until the failover."""
    cold = tmp_path / "cold"
    shutil.copytree(HELLO, cold)
    toml = cold / "wakeful.toml"
    toml.write_text(toml.read_text().replace('name = "hello"', 'name = "cold"'))
    return cold


def _other_app(tmp_path: Path, slow: bool = False) -> Path:
    """The sample app as `other`; `slow`: its next version, whose sandboxes take 3 s to start
    (a rollout the leader's death interrupts; another app than the one probed, whose lease is
    the one the heir must adopt)."""
    where = tmp_path / ("other-v2" if slow else "other")
    shutil.copytree(HELLO, where)
    toml = where / "wakeful.toml"
    text = toml.read_text().replace('name = "hello"', 'name = "other"')
    if slow:
        command = 'command = ["sh", "-c", "sleep 3 && exec python3 app.py"]'
        text = text.replace('command = ["python3", "app.py"]', command)
    toml.write_text(text)
    return where


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_killing_the_leading_activator_under_load_fails_no_request(
    etcd_server: EtcdServer, tmp_path: Path, kill: signal.Signals
) -> None:
    """SIGTERM: the leader resigns as it stops, and the standby takes over at once; SIGKILL:
    after the election's TTL."""
    processes: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    with start_cluster(
        etcd_server.url,
        tmp_path,
        nodes=("n1",),
        activators=2,
        processes=processes,
        activator_urls=urls,
        # Leases that outlive any takeover here, however loaded the machine: the ingress
        # keeps its lease (and reports it) instead of letting it lapse and asking anew.
        role_env={"activator": {"WAKEFUL_LEASE_TTL": "60"}},
    ) as (api, proxy, env):
        leader, heir = processes[0], urls[1]
        deploy(api, env)
        deploy(api, env, _cold_app(tmp_path))
        deploy(api, env, _other_app(tmp_path))
        standing_by = httpx.get(f"{heir}/v1/pools", headers=ADMIN, timeout=10)
        assert standing_by.status_code == 503 and "standby" in standing_by.text
        assert api in standing_by.json()["detail"]  # it names the leader
        assert leads(api) and not leads(heir)
        # Both answer /metrics: which leads, and whether each reaches the store (so the
        # store alert has a series whichever leads, ops/prometheus/wakeful-rules.yml).
        standby_metrics = httpx.get(f"{heir}/metrics", timeout=10)
        assert standby_metrics.status_code == 200
        assert "wakeful_activator_leading 0.0" in standby_metrics.text
        assert "wakeful_store_up 1.0" in standby_metrics.text
        assert "wakeful_activator_leading 1.0" in httpx.get(f"{api}/metrics", timeout=10).text
        # The CLI given every activator finds the leader, whichever is named first.
        assert "hello" in _status(env, f"{heir},{api}")

        with Prober(proxy, "hello.localhost") as prober:
            prober.wait_served(20)
            # A deploy under way when the leader goes: its new version takes 3 s to start.
            rolling = subprocess.Popen(
                [*WAKEFUL, "deploy", str(_other_app(tmp_path, slow=True))],
                env={**env, "WAKEFUL_API": f"{api},{heir}"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert rolling.stdout is not None
            assert "starting" in rolling.stdout.readline()  # prepared by the leader
            leader.send_signal(kill)
            killed_at = time.monotonic()
            # Asked while no activator leads: the ingress makes the acquire again on the heir.
            woke: list[httpx.Response] = []
            waking = threading.Thread(
                target=lambda: woke.append(
                    httpx.get(f"{proxy}/", headers={"Host": "cold.localhost"}, timeout=60)
                )
            )
            waking.start()
            took_over = None
            while time.monotonic() < killed_at + 60:
                if leads(heir):
                    took_over = time.monotonic() - killed_at
                    break
                time.sleep(0.1)
            assert took_over is not None, "the standby never took over"
            # The cold app wakes through the new leader (its artifact in the shared directory).
            waking.join(timeout=60)
            assert woke and woke[0].status_code == 200, woke and woke[0].text
            woke_after = time.monotonic() - killed_at
            prober.wait_served(20)
            pools = httpx.get(f"{heir}/v1/pools", headers=ADMIN, timeout=10)
            metrics = httpx.get(f"{heir}/metrics", timeout=10).text
        print(
            f"took over in {took_over:.1f} s; a cold app asked at the kill answered after "
            f"{woke_after:.1f} s; warm app answers: {prober.served()} of {len(prober.answers)}"
        )
        # The heir carried the rollout on, and the CLI followed it there.
        deployed = rolling.communicate(timeout=120)[0]
        assert rolling.returncode == 0 and "other v2 is live" in deployed, deployed
        assert not prober.failed(), prober.failed()[:5]
        assert "hello" in _status(env, f"{api},{heir}")  # the dead one first
        assert pools.status_code == 200
        hello = next(p for p in pools.json() if p["app"] == "hello" and p["state"] == "active")
        assert hello["ready"] == 1 and hello["leased"] >= 1
        # The ingress's cached lease kept its capacity on the heir: adopted, not re-granted.
        adopted = re.search(r"^wakeful_activator_adopted_leases_total (\S+)$", metrics, re.M)
        assert adopted is not None and float(adopted.group(1)) >= 1, metrics


def _status(env: dict[str, str], apis: str) -> str:
    done = subprocess.run(
        [*WAKEFUL, "status"],
        env={**env, "WAKEFUL_API": apis},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
