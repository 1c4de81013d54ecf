"""A ramp outlives its leader (issue 39): two activators on one etcd, `wakeful deploy --ramp`
under way, the leader SIGKILLed after the first share. The standby takes over, carries the
ramp on from its record by the clock, and the CLI, following it there, sees it reach 100%;
a prober asking the app all along sees no failed request."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import deploy, leads, start_cluster
from tests.support.prober import Prober
from tests.support.up import HELLO, WAKEFUL
from wakeful.store.testing import EtcdServer

ADMIN = {"Authorization": "Bearer distributed-token"}


@pytest.mark.etcd
def test_a_ramp_goes_on_to_100_after_its_leader_is_sigkilled(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    processes: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    with start_cluster(
        etcd_server.url,
        tmp_path,
        nodes=("n1",),
        activators=2,
        processes=processes,
        activator_urls=urls,
        role_env={"activator": {"WAKEFUL_LEASE_TTL": "60"}},
    ) as (api, proxy, env):
        deploy(api, env)
        second = tmp_path / "hello-v2"
        shutil.copytree(HELLO, second)
        # The verdict stays on errors: a loaded machine's latency noise is not this test's.
        toml = second / "wakeful.toml"
        toml.write_text(toml.read_text() + "\n[rollout]\nmin_p99_increase_ms = 2000\n")
        with Prober(proxy, "hello.localhost") as prober:
            prober.wait_served(20)
            ramping = subprocess.Popen(
                [*WAKEFUL, "deploy", str(second), "--ramp", "20s"],
                env={**env, "WAKEFUL_API": f"{api},{urls[1]}"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert ramping.stdout is not None
            said = []
            for line in ramping.stdout:  # until the first share is written
                said.append(line)
                if "ramping to 100%" in line:
                    break
            assert "hello v2 at 1% beside v1, ramping to 100% over 20 s" in said[-1], said
            processes[0].send_signal(signal.SIGKILL)
            rest = ramping.communicate(timeout=180)[0]
            assert ramping.returncode == 0, "".join(said) + rest
            assert "hello v2 is live: the ramp reached 100%" in rest, rest
            assert leads(urls[1])
            prober.wait_served(20)
        assert not prober.failed(), prober.failed()[:5]
        apps = httpx.get(f"{urls[1]}/v1/apps", headers=ADMIN, timeout=10).json()
        hello = next(a for a in apps if a["name"] == "hello")
        assert (hello["active_version"], hello["split"]) == ("v2", {})
