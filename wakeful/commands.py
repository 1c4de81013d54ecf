"""What the commands that talk to a running control plane do: each takes a `ControlClient`
and the arguments it needs, prints, and returns an exit status. Failures to talk to the control
API arrive as `ControlApiError`s; a failure of the command's own is a `CliError`. `pause`
(`time.sleep` by default) is how the commands that watch something wait between looks.

What the control API answers can hold text an app controls (its output, a crash log in a
rollout message, a reason quoting it), so every line goes out through `say` (stdout) or `note`
(stderr), which show control characters as escapes (`wakeful.domain.shown`), or through
`say_json`, whose JSON escapes them and keeps the text exact.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wakeful.aio.packing import pack
from wakeful.deploy.appdir import AppDir
from wakeful.domain.artifacts import digest_of
from wakeful.domain.models import (
    secret_name_problem,
    secret_value_problem,
)
from wakeful.domain.shown import shown
from wakeful.oci.errors import ImageRefused
from wakeful.oci.resolve import parse_reference

from .remote import ApiRefused, ApiUnreachable, ControlApiError, ControlClient
from .tables import (
    app_line,
    cert_table,
    deletion_line,
    node_line,
    pool_table,
    progress_counts,
    secret_table,
    token_table,
    version_lines,
)

USAGE = 2
"""Exit status for a command line or configuration that cannot work (a flag, a file, a
variable): nothing was tried."""
RUNTIME = 1
"""Exit status for a failure while doing the work (nothing to talk to, a refusal, a port)."""

Pause = Callable[[float], None]
POLL = 0.5
"""Seconds between looks at a rollout, a deletion or a drain."""
FAILOVER_WAIT = 30.0
"""How long a command following a rollout waits for a control plane that stopped answering
(a new leader takes over within seconds)."""
ROUTED_WAIT = 10.0
"""Seconds a deploy, once done, waits for every ingress to route the app (`wait_routed`)."""


class CliError(Exception):
    """A failure the user can act on: printed as one line, exit USAGE or RUNTIME."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


def say(text: str, *, indent: bool = False) -> None:
    """`text`, one line or several, on stdout: control characters shown as escapes. `indent`:
    the lines after the first are set off (`shown.CONTINUED`), for text an app wrote, such as
    a crash log in a rollout message, which must not pass for lines of wakeful's own."""
    print(shown(text, multiline=True, indent=indent), flush=True)


def note(line: str) -> None:
    """`wakeful: line` on stderr: control characters shown as escapes."""
    print(f"wakeful: {shown(line, multiline=True)}", file=sys.stderr, flush=True)


def say_json(value: Any, indent: int | None = None) -> None:
    """`value` as JSON on stdout, its text exact: `json.dumps` writes each control and
    non-ASCII character as a `\\u` escape (`ensure_ascii`), so nothing reaches the terminal
    raw either."""
    print(json.dumps(value, indent=indent, ensure_ascii=True), flush=True)


def deploy(
    api: ControlClient,
    app_dir: AppDir,
    *,
    canary: int = 0,
    ramp: float = 0.0,
    keep_split: bool = False,
    pause: Pause = time.sleep,
) -> int:
    """An app directory: packed and uploaded, then deployed; an image app's directory is not
    packed (its image is its files), an archive it names is uploaded instead (a directory to
    build: `wakeful.build_commands`)."""
    definition = app_dir.definition
    image = definition.spec.image
    digest = archive = None
    if image is None:
        data = pack(app_dir.path)
        digest = digest_of(data)
        api.put_artifact(digest, data)
    elif app_dir.archive is not None:
        say(f"uploading {image.partition(':')[2]}")
        archive = api.put_image_archive(app_dir.archive)
    if image is not None and archive is None:
        try:
            parse_reference(image)  # a reference the control plane would refuse: not "pulling"
        except ImageRefused as exc:
            raise CliError(f"deploy refused: {exc}", USAGE) from None
        say(f"pulling {image}")
    report = api.start_deploy(
        definition.model_dump(mode="json"),
        digest,
        archive,
        canary=canary,
        ramp=ramp,
        keep_split=keep_split,
    )
    return follow_rollout(api, report, pause)


def rollback(api: ControlClient, app: str, *, pause: Pause = time.sleep) -> int:
    return follow_rollout(api, api.rollback(app), pause)


def follow_rollout(
    api: ControlClient, report: dict[str, Any], pause: Pause, routed_within: float = ROUTED_WAIT
) -> int:
    """Each new message of the rollout until it is done; non-zero when it was abandoned.
    While no activator answers (a leader changing: the rollout goes on, carried on by the next
    one), it keeps asking for up to `FAILOVER_WAIT` seconds."""
    say(report["message"], indent=True)
    last = report["message"]
    away = 0
    while report["phase"] in ("rolling", "ramping"):
        pause(POLL)
        try:
            report = api.rollout(report["app"], report["version"])
        except (ApiUnreachable, ApiRefused) as exc:
            if isinstance(exc, ApiRefused) and exc.status != 503:
                raise
            if away == 0:
                note(f"the control plane does not answer ({exc}); still following")
            away += 1
            if away * POLL > FAILOVER_WAIT:
                raise
            continue
        away = 0
        if report["message"] != last:
            say(report["message"], indent=True)
            last = report["message"]
    if report["phase"] == "failed":
        return 1
    wait_routed(api, report["app"], routed_within)
    return 0


def wait_routed(api: ControlClient, app: str, within: float = ROUTED_WAIT) -> None:
    """Until every ingress the control plane knows has followed the store past the app's
    record, so a request sent once the command returns finds it on any of them; for at
    most `within` seconds, then a note names those still behind. A control plane that has
    no such route (an older one) answers 404: nothing to wait for."""
    try:
        report = api.routed(app, within)
        behind, revision = report["behind"], report["revision"]
        if not isinstance(behind, dict):
            raise TypeError(f"behind is {type(behind).__name__}")
    except ApiRefused as exc:
        if exc.status != 404:
            note(f"could not tell whether every ingress routes {app} yet: {exc}")
        return
    except (ControlApiError, TypeError, KeyError) as exc:
        note(f"could not tell whether every ingress routes {app} yet: {exc}")
        return
    for name, reached in sorted(behind.items()):
        note(
            f"ingress {name} does not route {app} as deployed yet (its routes at revision "
            f"{reached}, the app's record at {revision}): a request there may "
            "get the previous version, or 404 for a new app, for a moment"
        )


def delete(api: ControlClient, app: str, *, wait: bool, pause: Pause = time.sleep) -> int:
    report = api.delete_app(app)
    say(deletion_line(app, report))
    if not wait:
        return 0
    pools = report["pools"]
    while [p for p in api.pools() if p["pool"] in pools]:
        pause(POLL)
    say(f"{app} is gone")
    return 0


def status(api: ControlClient, app: str | None, *, as_json: bool) -> int:
    pools = api.pools()
    if app:
        pools = [p for p in pools if p["app"] == app]
        if not pools and all(found["name"] != app for found in api.apps()):
            raise CliError(f"no app named {app!r}", RUNTIME)  # not an empty table
    return _show(pools, pool_table, as_json)


def apps(api: ControlClient) -> int:
    for app in api.apps():
        say(app_line(app))
    return 0


def versions(api: ControlClient, app: str) -> int:
    for found in api.apps():
        if found["name"] == app:
            for line in version_lines(found):
                say(line)
            return 0
    raise CliError(f"no app named {app!r}", RUNTIME)


def nodes(api: ControlClient) -> int:
    for node in api.nodes():
        say(node_line(node))
    return 0


def drain(
    api: ControlClient,
    node: str,
    *,
    evacuate: bool,
    force: bool,
    undo: bool,
    pause: Pause = time.sleep,
) -> int:
    if undo:
        listed = {n["name"]: n["registered"] for n in api.nodes()}
        if node not in listed:
            raise CliError(f"no node named {node!r} is listed: nothing to uncordon", RUNTIME)
        api.undrain(node)
        if listed[node]:
            say(f"{node} takes new sandboxes again")
        else:  # a node stopped for good: its agent's cordon kept it listed
            say(f"{node} is not running: uncordoned, and no longer listed until it starts again")
        return 0
    api.drain(node, evacuate=evacuate, force=force)
    if not evacuate:
        say(f"{node} is cordoned: no new sandboxes; the ones there keep running")
        return 0
    say(
        f"evacuating {node}: replacing its stateless sandboxes elsewhere, moving stateful "
        "ones with their state, then draining them"
    )
    last = None
    while True:
        report = api.node(node)
        if not report.get("evacuating"):
            raise CliError(f"the drain of {node} was undone before it finished", RUNTIME)
        moving = report.get("progress") or {}
        line = f"  {node}: {progress_counts(moving)}"
        if line != last:
            say(line)
            last = line
        if moving.get("done", True):
            break
        pause(POLL)
    for problem in moving.get("problems", []):
        where = problem.get("sandbox") or "its state"
        say(f"  cannot move {problem['app']} ({where}): {shown(problem['reason'])}")
    if moving.get("failed"):
        raise CliError(f"{moving['failed']} could not leave {node} (reasons above)", RUNTIME)
    say(f"{node} is empty: nothing of any app is left on it")
    return 0


def release_state(api: ControlClient, app: str) -> int:
    released = api.release_state(app)
    reason = shown(released["error"])  # quotes what the app named: one line
    say(f"the state of {app} is free again at its last archive: {reason}")
    return 0


# -- role tokens ------------------------------------------------------------------------------

WHERE = {
    "node": "set it as WAKEFUL_NODE_TOKEN for `wakeful node`",
    "ingress": "set it as WAKEFUL_INGRESS_TOKEN for `wakeful ingress`",
    "admin": "set it as WAKEFUL_TOKEN for the commands that talk to the control plane",
}


def _secret(issued: dict[str, Any], what: str) -> int:
    """A secret alone on stdout (`export X=$(wakeful tokens create ...)`), what to do with it
    on stderr; or, for `wakeful up`'s admin token, where it was written."""
    if issued.get("written_to"):
        say(f"{what}: written to {issued['written_to']}; the old one is refused from now on")
    else:
        say(issued["secret"])
        note(f"{what}: shown this once; {WHERE[issued['role']]}")
    if not issued.get("effective", True):
        note("the control plane has not applied it yet: the old secret works until it does")
    return 0


def tokens_create(api: ControlClient, name: str, role: str) -> int:
    issued = api.create_token(name, role)
    return _secret(issued, f"token {name} (role {role}, id {issued['id']})")


def tokens_rotate(api: ControlClient, name: str) -> int:
    issued = api.rotate_token(name)
    return _secret(issued, f"new secret for {name} (role {issued['role']}, id {issued['id']})")


def tokens_revoke(api: ControlClient, name: str) -> int:
    if api.revoke_token(name):
        say(f"revoked {name}: its secret is refused from now on")
    else:
        say(f"revoked {name}: the control plane has not applied it yet; it will within seconds")
    return 0


def certs(api: ControlClient, *, as_json: bool) -> int:
    return _show(api.certs(), cert_table, as_json)


def tokens_list(api: ControlClient, *, as_json: bool) -> int:
    return _show(api.tokens(), token_table, as_json)


def _show(
    rows: Sequence[Mapping[str, Any]],
    table: Callable[[Sequence[Mapping[str, Any]]], list[str]],
    as_json: bool,
) -> int:
    """Print `rows` as JSON, or as the lines `table` makes of them."""
    if as_json:
        say_json(rows, indent=2)
        return 0
    for line in table(rows):
        say(line)
    return 0


# -- app secrets ------------------------------------------------------------------------------

STDIN = "-"
"""A value read from standard input, so that it never reaches the shell's history."""


def secret_assignments(arguments: Sequence[str], read_stdin: Callable[[], str]) -> dict[str, str]:
    """`NAME=VALUE ...` as a dict; a value of `-` is standard input, whole, one trailing
    newline taken off (at most one `-`). `CliError` naming the argument or the name: never a
    value, nor an argument with no `=` (it may be a value typed where NAME=VALUE goes)."""
    values: dict[str, str] = {}
    from_stdin = None
    for at, argument in enumerate(arguments, start=1):
        name, equals, value = argument.partition("=")
        if not equals or not name:
            raise CliError(f"argument {at} after the app is not NAME=VALUE")
        problem = secret_name_problem(name)
        if problem is not None:
            raise CliError(f"argument {at}: the name {shown(name[:64])!r} {problem}")
        if name in values:
            raise CliError(f"{name} is given twice")
        if value == STDIN:
            if from_stdin is not None:
                raise CliError(f"{from_stdin} and {name} are both -: one value is read from stdin")
            from_stdin = name
            value = read_stdin().removesuffix("\n")
        problem = secret_value_problem(value)
        if problem is not None:
            raise CliError(f"{name}: the value {problem}")
        values[name] = value
    return values


def _restarting(changed: Mapping[str, Any]) -> str:
    if changed["restart"]:
        return f"; replacing {changed['sandboxes']} running sandbox(es), draining the old ones"
    return "; running sandboxes keep the old values until they next start (--no-restart)"


def secrets_set(
    api: ControlClient,
    app: str,
    arguments: Sequence[str],
    *,
    restart: bool,
    read_stdin: Callable[[], str] = lambda: sys.stdin.read(),
) -> int:
    values = secret_assignments(arguments, read_stdin)
    if not values:
        raise CliError("give at least one NAME=VALUE")
    changed = api.set_secrets(app, values, restart=restart)
    if not changed["set"] and not changed["unset"]:
        say(f"{app}: {', '.join(changed['unchanged'])} already set to that; nothing changed")
        return 0
    what = ", ".join(changed["set"])
    say(f"{app}: set {what} (generation {changed['generation']}){_restarting(changed)}")
    return 0


def secrets_unset(api: ControlClient, app: str, names: Sequence[str], *, restart: bool) -> int:
    changed = api.unset_secrets(app, names, restart=restart)
    what = ", ".join(changed["unset"])
    say(f"{app}: unset {what} (generation {changed['generation']}){_restarting(changed)}")
    return 0


def secrets_list(api: ControlClient, app: str, *, as_json: bool) -> int:
    listing = api.secrets(app)
    if as_json:
        say_json(listing, indent=2)
        return 0
    if not listing["secrets"]:
        say(f"{app} has no secrets")
        return 0
    for line in secret_table(listing):
        say(line)
    return 0


def secrets_rotate_key(api: ControlClient) -> int:
    rotated = api.rotate_secrets_key()
    count, acme = rotated.get("logins", 0), rotated.get("acme", 0)
    logins = f", {count} registry login(s)" if count else ""
    logins += f", {acme} key(s) from ACME" if acme else ""
    say(
        f"secrets key {rotated['id']} is current; {rotated['values']} value(s) of "
        f"{rotated['records']} app(s){logins} sealed again under it (no restart)"
    )
    note(
        f"key {rotated['previous']} is kept for backups taken before now; once none is needed, "
        f"`wakeful secrets retire-key {rotated['previous']}`"
    )
    return 0


def secrets_retire_key(api: ControlClient, key_id: str) -> int:
    api.retire_secrets_key(key_id)
    say(f"retired secrets key {key_id}: deleted; a backup sealed under it no longer opens")
    return 0


# -- registries' logins -----------------------------------------------------------------------
