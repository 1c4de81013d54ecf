"""App secrets under `wakeful up` (issue 35), as a user meets them: set from standard input,
read by the app from its environment, changed under load without a failed request, and in no
file, listing, log, status, metric, dashboard event or backup; only the app's own node may
fetch them, and a control plane without the key that sealed them refuses to start."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.prober import Prober
from tests.support.up import WAKEFUL, Up, cli, cli_async, make_app, start_up, stop_up
from tests.support.vault import failures, files_holding, secret_value, vault_app
from wakeful.store.testing import free_port
from wakeful.testing import up_command

pytestmark = pytest.mark.anyio

VAULT = "vault.localhost"
ASK = "/env?name=DB_PASSWORD"


def set_from_stdin(up: Up, value: str) -> subprocess.CompletedProcess[str]:
    """`secrets set vault DB_PASSWORD=-`: the value from standard input, never an argument."""
    return subprocess.run(
        [*WAKEFUL, "--data-dir", str(up.data_dir), "secrets", "set", "vault", "DB_PASSWORD=-"],
        input=value + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def shown_anywhere(up: Up, values: list[str]) -> list[str]:
    """Every place a person or a tool reads from the control plane that holds a value."""
    seen = []
    reads = {
        "secrets list": cli(up, "secrets", "list", "vault"),
        "secrets list --json": cli(up, "secrets", "list", "vault", "--json"),
        "logs vault": cli(up, "logs", "vault"),
        "logs vault --json": cli(up, "logs", "vault", "--json"),
        "status --json": cli(up, "status", "--json"),
        "versions vault": cli(up, "versions", "vault"),
    }
    texts = {name: done.stdout + done.stderr for name, done in reads.items()}
    async with httpx.AsyncClient(timeout=30) as client:
        texts["control /metrics"] = (await client.get(f"{up.api}/metrics")).text
        texts["ingress /metrics"] = (await client.get(f"{up.admin}/metrics")).text
        texts["dashboard"] = await dashboard_snapshot(client, up)
    for name, text in texts.items():
        seen += [name for value in values if value in text]
    return seen


async def dashboard_snapshot(client: httpx.AsyncClient, up: Up) -> str:
    """The dashboard's first event after a login with the admin token: what its page shows."""
    login = await client.post(
        f"{up.api}/ui/login",
        data={"token": up.token},
        headers={"Origin": up.api},
        follow_redirects=False,
    )
    assert login.status_code == 303, login.text
    text = ""
    with anyio.move_on_after(10):
        async with client.stream("GET", f"{up.api}/ui/events", cookies=login.cookies) as events:
            async for line in events.aiter_lines():
                text += line + "\n"
                if line.startswith("data:") and len(line) > 20:
                    break
    assert "data:" in text, text
    return text


async def test_a_secret_reaches_its_app_alone_and_changes_under_load(tmp_path: Path) -> None:
    first, second = secret_value(), secret_value()
    up = start_up(tmp_path, vault_app(tmp_path), make_app(tmp_path, "hello"))
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            assert (await client.get(ASK, headers={"Host": VAULT})).text == "unset"
        with Prober(up.proxy, VAULT, ASK) as prober:
            done = await anyio.to_thread.run_sync(lambda: set_from_stdin(up, first))
            assert done.returncode == 0, done.stderr
            assert first not in done.stdout + done.stderr
            await anyio.to_thread.run_sync(prober.wait_for, first)
            changed = await cli_async(up, "secrets", "set", "vault", f"DB_PASSWORD={second}")
            assert changed.returncode == 0, changed.stderr
            await anyio.to_thread.run_sync(prober.wait_for, second)
        assert not failures(prober), failures(prober)[:5]
        served = {a.text for a in prober.answers}
        assert {first, second} <= served

        listed = json.loads(cli(up, "secrets", "list", "vault", "--json").stdout)
        assert [entry["name"] for entry in listed["secrets"]] == ["DB_PASSWORD"], listed
        assert await shown_anywhere(up, [first, second]) == []

        backup = tmp_path / "backup.jsonl"
        saved = await cli_async(up, "backup", str(backup))
        assert saved.returncode == 0, saved.stderr
        assert "secrets/vault" in backup.read_text()  # it is there, sealed
        assert files_holding(tmp_path, first) == files_holding(tmp_path, second) == []

        await only_the_apps_node_may_fetch(up)

        # A manifest whose env names a secret of the app is refused, naming both.
        clash = vault_app(tmp_path / "clash", env={"DB_PASSWORD": "plain"})
        refused = await cli_async(up, "deploy", str(clash))
        assert refused.returncode != 0
        assert "DB_PASSWORD" in refused.stdout + refused.stderr, refused.stderr
        assert "plain" not in refused.stdout + refused.stderr

        # Without the key that sealed them, the control plane refuses to start: one line.
        stop_up(up)
        keys = up.data_dir / "secret-keys"
        key_ids = [path.stem for path in keys.glob("*.key")]
        shutil.move(keys, tmp_path / "keys-aside")
        command = up_command(
            up.data_dir, [], proxy=free_port(), api=free_port(), admin=free_port(), idle_interval=1
        )
        without = await anyio.to_thread.run_sync(
            lambda: subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        )
        assert without.returncode != 0
        complaint = without.stderr.strip().splitlines()
        assert len(complaint) == 1 and any(k in complaint[0] for k in key_ids), without.stderr
        assert "WAKEFUL_SECRETS_KEYS" in complaint[0] or str(keys) in complaint[0]

        # With it back, the app has its value again; unset under load takes it away.
        shutil.rmtree(keys, ignore_errors=True)  # the refused start may have made it anew
        shutil.move(tmp_path / "keys-aside", keys)
        up = start_up(tmp_path)  # the same data directory
        with Prober(up.proxy, VAULT, ASK) as prober:
            await anyio.to_thread.run_sync(prober.wait_for, second)
            gone = await cli_async(up, "secrets", "unset", "vault", "DB_PASSWORD")
            assert gone.returncode == 0, gone.stderr
            await anyio.to_thread.run_sync(prober.wait_for, "unset")
        assert not failures(prober), failures(prober)[:5]
    finally:
        stop_up(up)


async def only_the_apps_node_may_fetch(up: Up) -> None:
    """No token reads a running sandbox's secrets back: not the admin's, not another node's,
    not even its own node's once it has started."""
    sandboxes = [
        path.name
        for path in (up.data_dir / "sandboxes").iterdir()
        if not path.name.startswith("slot-")  # a warm slot, no sandbox yet
    ]
    assert sandboxes
    async with httpx.AsyncClient(base_url=up.api, timeout=30) as client:
        nodes = await client.get("/v1/nodes", headers={"Authorization": f"Bearer {up.token}"})
        own = nodes.json()[0]["name"]
        tokens = {"admin": up.token}
        for name in (own, "elsewhere"):
            made = cli(up, "tokens", "create", "--role", "node", "--name", name)
            assert made.returncode == 0, made.stderr
            tokens[name] = made.stdout.strip()
        for who, token in tokens.items():
            for sandbox in sandboxes:
                answer = await client.get(
                    f"/v1/sandboxes/{sandbox}/secrets",
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert answer.status_code == 403, (who, answer.status_code, answer.text)
