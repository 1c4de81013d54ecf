"""`wakeful secrets` as real CLI processes against a running control plane: a value read from
stdin (`-`) reaches the app's record sealed; `list` never prints a value; errors name the
argument or the name, never the value; `rotate-key` and `retire-key`; and `wakeful activator`
lacking a key the store needs stops with one line naming the key id and the directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.support.control import TOKEN, running_control_plane
from wakeful.commands import CliError, secret_assignments
from wakeful.domain import keys
from wakeful.domain.models import App, AppSecrets
from wakeful.secrets.book import SecretBook
from wakeful.secrets.keys import KeyRing
from wakeful.store import open_store, sqlite_url
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio
WAKEFUL = [sys.executable, "-m", "wakeful.cli"]
PASSWORD = "s3cret-from-stdin-never-printed"


async def wakeful(
    *args: str, api: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    base["WAKEFUL_TOKEN"] = TOKEN
    where = ["--api", api] if api else []
    done = await anyio.run_process(
        [*WAKEFUL, *where, *args], env=base | (env or {}), check=False, input=stdin.encode()
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


@pytest.mark.parametrize(
    ("arguments", "stdin", "result"),
    [
        pytest.param(["A=1", "B="], "", {"A": "1", "B": ""}, id="a value and an empty one"),
        pytest.param(["A=x=y"], "", {"A": "x=y"}, id="the first = splits"),
        pytest.param(["A=-"], f"{PASSWORD}\n", {"A": PASSWORD}, id="stdin, its newline off"),
        pytest.param(["A=-"], "two\nlines\n\n", {"A": "two\nlines\n"}, id="stdin whole, one off"),
        pytest.param([PASSWORD], "", "argument 1 after the app is not NAME=VALUE", id="no ="),
        pytest.param([f"={PASSWORD}"], "", "argument 1 after the app is not NAME", id="no name"),
        pytest.param([f"a-b={PASSWORD}"], "", "argument 1: the name 'a-b' is not", id="bad name"),
        pytest.param([f"PORT={PASSWORD}"], "", "set by wakeful for every sandbox", id="PORT"),
        pytest.param(["A=1", "A=2"], "", "A is given twice", id="a name twice"),
        pytest.param(["A=-", "B=-"], "x", "A and B are both -", id="two values from stdin"),
        pytest.param(["A=-"], PASSWORD + "\0", "A: the value holds a NUL", id="a NUL from stdin"),
    ],
)
def test_name_value_arguments_are_read_or_refused_never_quoting_a_value(
    arguments: list[str], stdin: str, result: dict[str, str] | str
) -> None:
    if isinstance(result, dict):
        assert secret_assignments(arguments, lambda: stdin) == result
        return
    with pytest.raises(CliError) as refused:
        secret_assignments(arguments, lambda: stdin)
    assert result in str(refused.value) and PASSWORD not in str(refused.value)


async def test_set_from_stdin_list_unset_rotate_and_retire(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        await running.store.put(keys.app("web"), App(name="web"))
        done = await wakeful(
            "secrets", "set", "web", "DB_PASSWORD=-", "MODE=fast", api=running.url,
            stdin=PASSWORD + "\n",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "web: set DB_PASSWORD, MODE (generation 1)" in done.stdout
        assert PASSWORD not in done.stdout + done.stderr
        record = await running.store.get(keys.secrets("web"), AppSecrets)
        assert record is not None and PASSWORD not in record.value.model_dump_json()
        listed = await wakeful("secrets", "list", "web", api=running.url)
        assert listed.returncode == 0 and PASSWORD not in listed.stdout
        assert listed.stdout.split()[:4] == ["NAME", "SET", "BY", "KEY"]
        assert "DB_PASSWORD" in listed.stdout
        as_json = json.loads(
            (await wakeful("secrets", "list", "web", "--json", api=running.url)).stdout
        )
        assert [e["name"] for e in as_json["secrets"]] == ["DB_PASSWORD", "MODE"]
        late = await wakeful(
            "secrets", "set", "web", "MODE=slow", "--no-restart", "LEVEL=2", api=running.url
        )  # --no-restart after an assignment, as people type it
        assert late.returncode == 0, late.stderr
        assert "set LEVEL, MODE (generation 2)" in late.stdout and "--no-restart" in late.stdout
        quiet = await wakeful("secrets", "unset", "web", "MODE", "--no-restart", api=running.url)
        assert quiet.returncode == 0, quiet.stderr
        assert "unset MODE (generation 3)" in quiet.stdout and "--no-restart" in quiet.stdout
        rotated = await wakeful("secrets", "rotate-key", api=running.url)
        assert rotated.returncode == 0, rotated.stderr
        assert "2 value(s) of 1 app(s) sealed again" in rotated.stdout
        old = rotated.stderr.split("retire-key ")[1].split("`")[0]
        retired = await wakeful("secrets", "retire-key", old, api=running.url)
        assert retired.returncode == 0 and f"retired secrets key {old}" in retired.stdout
        env = await running.plane.secrets.listing("web")
        assert [e.name for e in env.secrets] == ["DB_PASSWORD", "LEVEL"]


async def test_refusals_name_the_field_and_never_the_value(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        await running.store.put(keys.app("web"), App(name="web"))
        for args, said, code in [
            (["set", "web", PASSWORD], "argument 1 after the app is not NAME=VALUE", 2),
            (["set", "nope", f"A={PASSWORD}"], "no app named 'nope'", 1),
            (["unset", "web", "MISSING"], "web has no secret named MISSING", 1),
            (["retire-key", "not-hex"], "is not a secrets key id", 2),
            (["set", "web", "A=1", "--bogus", f"B={PASSWORD}"], "argument 2 after the app", 2),
            (["list", "web", f"B={PASSWORD}"], "unrecognized arguments: B=…", 2),
        ]:
            done = await wakeful("secrets", *args, api=running.url)
            assert done.returncode == code, (args, done.stderr)
            assert said in done.stderr and PASSWORD not in done.stdout + done.stderr


async def test_an_activator_without_a_key_the_store_needs_stops_with_one_line(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path / "store.db")
    async with open_store(url) as store:
        ring = KeyRing(store, tmp_path / "leader-keys")
        key_id = await ring.start()
        await store.put(keys.app("web"), App(name="web"))
        await SecretBook(store, ring).set("web", {"A": PASSWORD}, by="admin")
    elsewhere = tmp_path / "other-keys"
    done = await wakeful(
        "--data-dir", str(tmp_path / "data"), "activator", api="",
        env={
            "WAKEFUL_STORE_URL": url,
            "WAKEFUL_SECRETS_KEYS": str(elsewhere),
            "WAKEFUL_LISTEN": f"127.0.0.1:{free_port()}",
        },
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"error: secrets key {key_id} is not in {elsewhere}" in line
    assert PASSWORD not in done.stdout + done.stderr
