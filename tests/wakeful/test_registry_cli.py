"""`wakeful registry` (wakeful/registry_cli.py, wakeful/domain/authfile.py): the password comes
from standard input (asked for, unechoed, on a terminal), never an argument, and no output
or error shows it; `list` prints hosts and usernames only; `import` reads podman's and
docker's auth file whole before it logs in to anything. Real CLI processes against a running
control plane, and the pure parts by table."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.control import running_control_plane
from tests.wakeful.test_secrets_cli import wakeful
from wakeful.commands import CliError
from wakeful.domain import keys
from wakeful.domain.authfile import AuthFileError, read_auth_file
from wakeful.domain.models import RegistryLogin
from wakeful.registry_cli import registry_login

pytestmark = pytest.mark.anyio
HOST = "registry.example.com:5000"
PASSWORD = "s3cret-from-stdin-never-printed"


class Plane:
    """What `registry_login` asks of the control API, recorded."""

    def __init__(self) -> None:
        self.logins: list[tuple[str, str, str]] = []

    def registry_login(self, host: str, username: str, password: str) -> dict[str, Any]:
        self.logins.append((host, username, password))
        return {"host": host, "username": username, "changed": True}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("host", "username", "stdin", "result"),
    [
        pytest.param(HOST, "ci", f"{PASSWORD}\n", (HOST, "ci", PASSWORD), id="stdin, newline off"),
        pytest.param("Index.Docker.IO", "me", PASSWORD, ("docker.io", "me", PASSWORD), id="hub"),
        pytest.param(HOST, None, PASSWORD, "give --username USER", id="no user and no terminal"),
        pytest.param(HOST, "ci", "\n", "the password (from standard input) is empty", id="empty"),
        pytest.param(HOST, "a:b", PASSWORD, "--username: the username holds ':'", id="user :"),
        pytest.param("https://r.example.com", "ci", PASSWORD, "is a URL or a path", id="a URL"),
        pytest.param(HOST, "ci", PASSWORD + "\0", "holds a NUL", id="a NUL"),
    ],
)  # fmt: skip
def test_login_reads_the_password_from_stdin_and_refuses_never_quoting_it(
    host: str, username: str | None, stdin: str, result: tuple[str, str, str] | str
) -> None:
    plane = Plane()
    if isinstance(result, tuple):
        assert registry_login(plane, host, username, stdin=io.StringIO(stdin)) == 0  # type: ignore[arg-type]
        assert plane.logins == [result]
        return
    with pytest.raises(CliError) as refused:
        registry_login(plane, host, username, stdin=io.StringIO(stdin))  # type: ignore[arg-type]
    assert result in str(refused.value) and PASSWORD not in str(refused.value)
    assert plane.logins == []


def test_on_a_terminal_the_user_and_password_are_asked_for() -> None:
    plane, asked = Plane(), []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return "ci"

    def ask_secret(prompt: str) -> str:
        asked.append(prompt)
        return PASSWORD

    terminal = Terminal("never read")
    assert registry_login(plane, HOST, None, stdin=terminal, ask=ask, ask_secret=ask_secret) == 0  # type: ignore[arg-type]
    assert asked == ["Username: ", f"Password for ci at {HOST}: "]
    assert plane.logins == [(HOST, "ci", PASSWORD)]


def auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize(
    ("auths", "result"),
    [
        pytest.param(
            {"https://index.docker.io/v1/": auth("me", PASSWORD), HOST: auth("ci", "p:w")},
            [("docker.io", "me", PASSWORD), (HOST, "ci", "p:w")],
            id="docker's legacy URL and a host; the first : splits",
        ),
        pytest.param(
            {"quay.io/team": auth("me", PASSWORD), "ghcr.io": {"identitytoken": "t"}},
            [],
            id="a repository's login and an identity token are skipped",
        ),
        pytest.param({HOST: {"auth": "%%%"}}, "not base64", id="not base64"),
        pytest.param(
            {HOST: {"auth": base64.b64encode(PASSWORD.encode()).decode()}}, "holds no ':'",
            id="no colon",
        ),
        pytest.param({"r_1.io": auth("me", PASSWORD)}, "the host is not a registry", id="bad host"),
        pytest.param(
            {"docker.io": auth("me", PASSWORD), "index.docker.io": auth("me", "other")},
            "are both logins for docker.io",
            id="one host, two logins",
        ),
    ],
)  # fmt: skip
def test_an_auth_file_is_read_whole_or_refused_naming_the_key(
    auths: dict[str, Any], result: list[tuple[str, str, str]] | str
) -> None:
    text = json.dumps({"auths": auths})
    if isinstance(result, list):
        assert [(x.host, x.username, x.password) for x in read_auth_file(text).logins] == result
        return
    with pytest.raises(AuthFileError) as refused:
        read_auth_file(text)
    said = str(refused.value)
    assert result in said and PASSWORD not in said and auths[next(iter(auths))]["auth"] not in said


async def test_login_list_import_and_logout_as_a_user_runs_them(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        api = running.url
        done = await wakeful("registry", "login", HOST, "-u", "ci", api=api, stdin=PASSWORD + "\n")
        assert done.returncode == 0, done.stderr
        assert f"{HOST}: logged in as ci" in done.stdout
        found = await running.store.get(keys.registry(HOST), RegistryLogin)
        assert found is not None
        assert await running.plane.registries.credentials(HOST) is not None
        typed = await wakeful("registry", "login", HOST, "-u", "ci", PASSWORD, api=api)
        assert typed.returncode == 2 and "not shown" in typed.stderr
        assert PASSWORD not in typed.stdout + typed.stderr
        auth_file = tmp_path / "auth.json"
        auth_file.write_text(
            json.dumps({"auths": {"ghcr.io": auth("bot", PASSWORD), "quay.io/t": auth("x", "y")}})
        )
        imported = await wakeful("registry", "import", str(auth_file), api=api)
        assert imported.returncode == 0, imported.stderr
        assert "ghcr.io: logged in as bot" in imported.stdout
        assert "skipped 'quay.io/t': a login per repository" in imported.stderr
        listed = await wakeful("registry", "list", api=api)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split() == ["HOST", "USER", "SET", "BY", "KEY"]
        assert [line.split()[:2] for line in lines[1:]] == [["ghcr.io", "bot"], [HOST, "ci"]]
        as_json = await wakeful("registry", "list", "--json", api=api)
        assert {e["host"] for e in json.loads(as_json.stdout)} == {"ghcr.io", HOST}
        gone = await wakeful("registry", "logout", HOST, api=api)
        assert gone.returncode == 0 and f"{HOST}: logged out" in gone.stdout
        again = await wakeful("registry", "logout", HOST, api=api)
        assert again.returncode == 1 and f"no login for registry {HOST}" in again.stderr
        for run in (done, typed, imported, listed, as_json, gone, again):
            assert PASSWORD not in run.stdout + run.stderr
