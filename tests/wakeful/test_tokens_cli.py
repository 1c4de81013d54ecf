"""`wakeful tokens` as real CLI processes against a running control plane: a secret is
printed once (alone on stdout) and `tokens list` never prints one; revoke and rotate take
effect before the command returns; errors name the field and the value; `rotate-admin`
rewrites `wakeful up`'s token file; a piece takes its role's token, and warns loudly when it
has only the admin token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.control import TOKEN, Running, running_control_plane
from tests.support.up import start_up, stop_up
from wakeful.commands import CliError
from wakeful.pieces import _control_for, cleartext_to_another_machine

pytestmark = pytest.mark.anyio
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]


async def wakeful(
    *args: str, api: str | None = None, token: str | None = TOKEN, data_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    if token is not None:
        env["WAKEFUL_TOKEN"] = token
    where = ["--api", api] if api else ["--data-dir", str(data_dir)]
    done = await anyio.run_process([*WAKEFUL, *where, *args], env=env, check=False)
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def status(running: Running, token: str, path: str = "/v1/artifacts/" + "0" * 64) -> int:
    async with httpx.AsyncClient(base_url=running.url) as http:
        answer = await http.get(path, headers={"Authorization": f"Bearer {token}"})
    return answer.status_code


async def test_create_list_rotate_and_revoke(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        made = await wakeful("tokens", "create", "--role", "node", "--name", "n1", api=running.url)
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip()
        assert made.stdout == secret + "\n" and len(secret) >= 43  # the secret alone
        assert "shown this once" in made.stderr and "WAKEFUL_NODE_TOKEN" in made.stderr
        assert secret not in made.stderr
        assert await status(running, secret) == 404  # allowed: no such artifact

        shown = [
            await wakeful("tokens", "list", *flag, api=running.url) for flag in ([], ["--json"])
        ]
        assert all(s.returncode == 0 for s in shown)
        assert shown[0].stdout.split("\n")[0].split() == [
            "NAME",
            "ROLE",
            "CREATED",
            "ROTATED",
            "ID",
        ]
        assert {line.split()[0] for line in shown[0].stdout.splitlines()[1:]} == {"admin", "n1"}
        listed = json.loads(shown[1].stdout)
        assert {t["name"]: t["role"] for t in listed} == {"admin": "admin", "n1": "node"}
        assert all(set(t) == {"name", "role", "id", "created_at", "rotated_at"} for t in listed)

        rotated = await wakeful("tokens", "rotate", "n1", api=running.url)
        assert rotated.returncode == 0, rotated.stderr
        new = rotated.stdout.strip()
        assert await status(running, secret) == 401  # refused once the command has returned
        assert await status(running, new) == 404

        again = [
            await wakeful("tokens", "list", *flag, api=running.url) for flag in ([], ["--json"])
        ]
        for listing in shown + again:
            for hidden in (secret, new, TOKEN):
                assert hidden not in listing.stdout + listing.stderr

        revoked = await wakeful("tokens", "revoke", "n1", api=running.url)
        assert revoked.returncode == 0, revoked.stderr
        assert "revoked n1" in revoked.stdout
        assert await status(running, new) == 401


async def test_errors_name_the_field_and_the_value(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        url = running.url
        role = await wakeful("tokens", "create", "--role", "bogus", "--name", "n1", api=url)
        assert role.returncode == 2
        assert "--role" in role.stderr and "'bogus'" in role.stderr
        name = await wakeful("tokens", "create", "--role", "node", "--name", "N_1", api=url)
        assert name.returncode == 2
        assert "--name" in name.stderr and "'N_1' is not a token name" in name.stderr
        unknown = await wakeful("tokens", "revoke", "nosuch", api=url)
        assert unknown.returncode == 1
        assert "no token named 'nosuch'" in unknown.stderr
        assert (
            await wakeful("tokens", "create", "--role", "node", "--name", "n1", api=url)
        ).returncode == 0
        twice = await wakeful("tokens", "create", "--role", "ingress", "--name", "n1", api=url)
        assert twice.returncode == 1 and "a token named 'n1' exists" in twice.stderr
        reserved = await wakeful("tokens", "create", "--role", "admin", "--name", "admin", api=url)
        assert reserved.returncode == 1 and "rotate-admin" in reserved.stderr
        kept = await wakeful("tokens", "revoke", "admin", api=url)
        assert kept.returncode == 1 and "admin token cannot be revoked" in kept.stderr
        wrong = await wakeful("tokens", "list", api=url, token="not-the-token")
        assert wrong.returncode == 1 and "401" in wrong.stderr
        assert "not-the-token" not in wrong.stderr


async def test_rotate_admin_under_wakeful_up_rewrites_its_token_file(tmp_path: Path) -> None:
    up = start_up(tmp_path, flags=["--isolation=none"])
    try:
        old = up.token
        rotated = await wakeful("tokens", "rotate-admin", data_dir=up.data_dir, token=None)
        assert rotated.returncode == 0, rotated.stderr
        token_file = up.data_dir / "token"
        assert f"written to {token_file}" in rotated.stdout
        new = token_file.read_text().strip()
        assert new != old and new not in rotated.stdout + rotated.stderr
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert json.loads((up.data_dir / "control.json").read_text())["token"] == new
        listed = await wakeful("tokens", "list", data_dir=up.data_dir, token=None)
        assert listed.returncode == 0, listed.stderr  # the other commands follow
        async with httpx.AsyncClient(base_url=up.api) as http:
            for token, expected in ((old, 401), (new, 200)):
                answer = await http.get("/v1/pools", headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == expected
    finally:
        stop_up(up)


def test_a_piece_takes_its_role_token_and_warns_when_given_only_the_admin_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("WAKEFUL_TOKEN", "WAKEFUL_NODE_TOKEN", "WAKEFUL_INGRESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WAKEFUL_API", "http://127.0.0.1:8082")
    with pytest.raises(CliError, match="WAKEFUL_NODE_TOKEN must be set"):
        _control_for("node", "why")
    monkeypatch.setenv("WAKEFUL_INGRESS_TOKEN", "the-ingress-token")
    assert _control_for("ingress", "why").token == "the-ingress-token"
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("WAKEFUL_TOKEN", "the-admin-token")
    assert _control_for("ingress", "why").token == "the-ingress-token"
    beside = capsys.readouterr().err  # the admin token left beside the role token
    assert "is set beside WAKEFUL_INGRESS_TOKEN" in beside and "the-admin-token" not in beside
    monkeypatch.setenv("WAKEFUL_API", "http://control:8082")
    _control_for("ingress", "why")
    assert "plain HTTP to another machine" in capsys.readouterr().err
    assert _control_for("node", "why").token == "the-admin-token"
    warned = capsys.readouterr().err
    assert "WAKEFUL_NODE_TOKEN is not set" in warned and "the admin token" in warned
    assert "the-admin-token" not in warned


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://127.0.0.1:8082", False),
        ("http://[::1]:8082", False),
        ("http://localhost:8082", False),
        ("https://control.example:8443", False),
        ("http://10.0.0.5:8082", True),
        ("http://control.example", True),
    ],
)
def test_plain_http_to_another_machine_is_called_out(url: str, warned: bool) -> None:
    assert cleartext_to_another_machine(url) is warned
