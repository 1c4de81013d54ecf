"""App secrets with two activators on etcd (issue 35): the key directory is shared as the
artifact directory is; a key rotated under load by the leader is one the standby did not have
when it started, and after a SIGKILL it takes over and still opens every value. etcd holds
only ciphertext (its records and its files), and an activator without the key refuses to
start with one line naming it."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import time
from pathlib import Path

import anyio
from etcd3aio import Etcd3Client

from tests.support.cluster import deploy, leads, start_cluster, wakeful_cli
from tests.support.prober import Prober
from tests.support.up import WAKEFUL
from tests.support.vault import failures, files_holding, secret_value, vault_app
from wakeful.store.testing import EtcdServer, free_port

VAULT = "vault.localhost"


async def _etcd_values(server: EtcdServer) -> bytes:
    """Every key and value etcd holds, one range read."""
    client = Etcd3Client([f"127.0.0.1:{server.client_port}"])
    await client.connect()
    try:
        assert client.kv is not None
        answer = await client.kv.get(b"\0", range_end=b"\0")
        return b"\n".join(kv.key + b"=" + kv.value for kv in answer.kvs)
    finally:
        await client.close()


def test_a_rotated_key_survives_a_takeover_and_etcd_holds_no_value(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    value = secret_value()
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
        heir = urls[1]
        every = {**env, "WAKEFUL_API": f"{api},{heir}"}
        deploy(api, env, vault_app(tmp_path))
        with Prober(proxy, VAULT, "/env?name=DB_PASSWORD") as prober:
            made = subprocess.run(
                [*WAKEFUL, "secrets", "set", "vault", "DB_PASSWORD=-"],
                input=value,
                env=every,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert made.returncode == 0, made.stderr
            prober.wait_for(value)
            before = json.loads(wakeful_cli(api, env, "secrets", "list", "vault", "--json").stdout)
            rotated = wakeful_cli(api, env, "secrets", "rotate-key")
            assert rotated.returncode == 0, rotated.stderr
            after = json.loads(wakeful_cli(api, env, "secrets", "list", "vault", "--json").stdout)
            key = after["secrets"][0]["key_id"]
            assert before["secrets"][0]["key_id"] != key, (before, after)  # sealed again
            assert key in rotated.stdout

            processes[0].send_signal(signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not leads(heir):
                assert time.monotonic() < deadline, "the standby never took over"
                time.sleep(0.1)
            # A change through the heir restarts the app: its new sandboxes get every value
            # from the heir, which opens what was sealed under the key made after it started.
            again = wakeful_cli(heir, env, "secrets", "set", "vault", "OTHER=x")
            assert again.returncode == 0, again.stderr
            with Prober(proxy, VAULT, "/env?name=OTHER") as other:
                other.wait_for("x")
            prober.wait_for(value)
        assert not failures(prober), failures(prober)[:5]

        with concurrent.futures.ThreadPoolExecutor(1) as thread:  # this thread has a loop
            held = thread.submit(anyio.run, _etcd_values, etcd_server).result(timeout=60)
        assert b"secrets/vault" in held
        assert value.encode() not in held
        assert files_holding(etcd_server.data_dir, value) == []
        assert files_holding(tmp_path, value) == []

        # An activator without the key directory's keys refuses to start: one line.
        lacking = subprocess.run(
            [*WAKEFUL, "--data-dir", str(tmp_path / "act-lacking"), "activator"],
            env={
                **env,
                "WAKEFUL_LISTEN": f"127.0.0.1:{free_port()}",
                "WAKEFUL_SECRETS_KEYS": str(tmp_path / "no-keys"),
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert lacking.returncode != 0
        lines = (lacking.stdout + lacking.stderr).strip().splitlines()
        assert len(lines) == 1 and key in lines[0], lacking.stdout + lacking.stderr
