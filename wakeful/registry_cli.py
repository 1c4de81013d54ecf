"""`wakeful registry login|logout|list|import`: the control plane's logins to image
registries (docs/design/registries.md), the commands and their parser. The password is read
from standard input, never an argument.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from wakeful.domain.authfile import MAX_FILE_BYTES, AuthFileError, read_auth_file
from wakeful.domain.models import (
    normal_registry_host,
    password_problem,
    registry_host_problem,
    username_problem,
)
from wakeful.domain.shown import shown

from .commands import RUNTIME, CliError, note, say, say_json
from .remote import ApiRefused, ControlClient
from .tables import (
    registry_table,
)

Command = Callable[[argparse.Namespace], int]


def registry_host(text: str) -> str:
    """HOST as the control plane keys it (lowercase; Docker Hub's aliases as docker.io)."""
    host = normal_registry_host(text)
    problem = registry_host_problem(host)
    if problem is not None:
        raise CliError(f"HOST {shown(text[:80])!r} {problem}")
    return host


def registry_login(
    api: ControlClient,
    host: str,
    username: str | None,
    *,
    stdin: TextIO | None = None,
    ask: Callable[[str], str] = input,
    ask_secret: Callable[[str], str] = getpass.getpass,
) -> int:
    """The password comes from standard input (asked for, unechoed, on a terminal), never
    from an argument; it goes to the control plane in a request's body and nowhere else."""
    stdin = stdin or sys.stdin
    host = registry_host(host)
    terminal = stdin.isatty()
    if username is None:
        if not terminal:
            raise CliError("give --username USER: standard input carries the password")
        username = ask("Username: ")
    problem = username_problem(username)
    if problem is not None:
        raise CliError(f"--username: the username {problem}")
    if terminal:
        password = ask_secret(f"Password for {username} at {host}: ")
    else:
        password = stdin.read(MAX_FILE_BYTES).removesuffix("\n")
    problem = password_problem(password)
    if problem is not None:
        raise CliError(f"the password (from standard input) {problem}")
    done = api.registry_login(host, username, password)
    if not done["changed"]:
        say(f"{host}: already logged in as {username}; nothing changed")
    else:
        say(f"{host}: logged in as {username}; deploys pull its images with this login")
    return 0


def registry_logout(api: ControlClient, host: str) -> int:
    done = api.registry_logout(registry_host(host))
    say(f"{done['host']}: logged out; its images are pulled without a login from now on")
    return 0


def registry_list(api: ControlClient, *, as_json: bool) -> int:
    logins = api.registries()
    if as_json:
        say_json(logins, indent=2)
    elif not logins:
        say("no registry logins")
    else:
        for line in registry_table(logins):
            say(line)
    return 0


def registry_import(api: ControlClient, path: Path) -> int:
    """Every login of a podman or docker auth file, read and checked whole first."""
    try:
        with path.open(encoding="utf-8") as file:
            text = file.read(MAX_FILE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    if len(text) > MAX_FILE_BYTES:
        raise CliError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not an auth file")
    try:
        found = read_auth_file(text)
    except AuthFileError as exc:
        raise CliError(f"{path}: {exc}") from None
    for line in found.skipped:
        note(f"skipped {line}")
    if not found.logins:
        raise CliError(f"{path}: no login to import", RUNTIME)
    done: list[str] = []
    for login in found.logins:
        try:
            api.registry_login(login.host, login.username, login.password)
        except ApiRefused as exc:
            before = f" (imported before it: {', '.join(done)})" if done else ""
            raise CliError(f"{login.host}: {exc.reason}{before}", RUNTIME) from None
        done.append(login.host)
        say(f"{login.host}: logged in as {login.username}")
    return 0


def registry_parser(
    registry: argparse.ArgumentParser,
    common: argparse.ArgumentParser,
    remote: Callable[[Callable[[ControlClient, argparse.Namespace], int]], Command],
) -> None:
    """`wakeful registry ...`. The password is read from standard input, never an argument
    (`main` does not quote what a `registry` command line has left over)."""
    sub = registry.add_subparsers(dest="registry_command", required=True, parser_class=type(common))
    login = sub.add_parser(
        "login",
        parents=[common],
        help="log the control plane in to HOST: the password from stdin (asked on a terminal)",
    )
    login.add_argument("host", metavar="HOST", help="registry.example.com[:PORT], docker.io")
    login.add_argument("--username", "-u", default=None, metavar="USER")
    login.set_defaults(func=remote(lambda api, a: registry_login(api, a.host, a.username)))
    logout = sub.add_parser("logout", parents=[common], help="forget HOST's login")
    logout.add_argument("host", metavar="HOST")
    logout.set_defaults(func=remote(lambda api, a: registry_logout(api, a.host)))
    listing = sub.add_parser("list", parents=[common], help="hosts and usernames: no password")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=remote(lambda api, a: registry_list(api, as_json=a.json)))
    imported = sub.add_parser(
        "import",
        parents=[common],
        help="the logins of a podman or docker auth file (auth.json, config.json)",
    )
    imported.add_argument("file", type=Path, metavar="FILE")
    imported.set_defaults(func=remote(lambda api, a: registry_import(api, a.file)))
