"""The `wakeful` command.

    wakeful up [APP_DIR ...]     every piece in one process on the embedded store
    wakeful deploy APP_DIR       deploy to a running control plane (a directory with a
                                 Containerfile or a stack's files is built here first;
                                 --dry-run prints what would be built and run)
    wakeful status [APP]         pools: desired, live, ready, suspended, leased, waiters
    wakeful apps | versions APP | logs APP | rollback APP | delete APP
    wakeful traffic APP [VERSION=PERCENT ...] | promote APP | tag APP VERSION TAG | untag APP TAG
    wakeful nodes | drain NODE   nodes; move everything off one (stateful apps with their state)
    wakeful release-state APP    free a stateful app's state a node keeps, at its last archive
    wakeful tokens create|list|revoke|rotate|rotate-admin
                                 role tokens for nodes and ingresses
    wakeful secrets set|unset|list APP | rotate-key | retire-key ID
                                 app secrets, sealed at rest, given only to the app's sandboxes
    wakeful registry login HOST [--username USER] | logout HOST | list | import FILE
                                 registry logins the control plane pulls images with (the
                                 password from stdin), sealed at rest, never on nodes
    wakeful certs [--json]       certificates from ACME (WAKEFUL_ACME_EMAIL): state, expiry, errors
    wakeful activator | node | ingress | idle-monitor
                                 run one piece against a shared store (etcd)
    wakeful etcd-auth            etcd users and roles per piece; authentication on
    wakeful backup FILE | restore FILE
                                 the store's records into a file, and back into an empty store

Errors name the flag, file or field and the value, and exit with status 2 (usage) or 1.

This module only turns arguments and WAKEFUL_* variables into settings and hands them on: to
`wakeful.commands` with a `wakeful.remote.ControlClient` for the commands that talk to a
running control plane, to `wakeful.pieces` for the ones that run pieces, to
`wakeful.storeadmin` for the ones that work on a store directly.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError
from pydantic_settings import SettingsError

from wakeful.domain.models import (
    ADMIN_TOKEN,
    Role,
    describe_validation_error,
)
from wakeful.domain.shown import shown

from . import build_commands, commands
from .commands import RUNTIME, USAGE, CliError
from .datadir import CONTROL_FILE
from .deploy.appdir import AppDir, image_definition, parse_duration
from .domain.stacks import BUILT_KINDS
from .logs_cli import logs_parser
from .pieces import (
    cmd_activator,
    cmd_idle_monitor,
    cmd_ingress,
    cmd_node,
    cmd_up,
    isolation_flag,
    load_apps,
)
from .registry_cli import registry_parser
from .remote import CliSettings, ControlApiError, ControlClient, locate
from .secrets_cli import DiscreetParser, secrets_parser, token_name
from .storeadmin import cmd_backup, cmd_etcd_auth, cmd_restore
from .traffic_cli import traffic_parsers

log = logging.getLogger("wakeful")

__all__ = ["RUNTIME", "USAGE", "CliError", "build_parser", "main"]

Command = Callable[[argparse.Namespace], int]


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ShownFormatter(logging.Formatter):
    """A record as `logging.Formatter` writes it, then with control characters shown as
    escapes (`wakeful.domain.shown`): a message can quote an app (its crash log, a name), and
    the terminal running `wakeful up` must not act on it. Newlines stay, every line after the
    first set off: a traceback or a crash log still reads as lines, none as a record of its
    own."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record), multiline=True, indent=True)


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(ShownFormatter(LOG_FORMAT))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


def _remote(run: Callable[[ControlClient, argparse.Namespace], int]) -> Command:
    """A command run with a client to the control plane that --api, WAKEFUL_API/WAKEFUL_TOKEN
    or the control file in --data-dir names."""

    def command(args: argparse.Namespace) -> int:
        endpoint = locate(CliSettings(), Path(args.data_dir) / CONTROL_FILE, args.api)
        with ControlClient(endpoint) as api:
            return run(api, args)

    return command


def _canary(value: str) -> int:
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 99:
        raise argparse.ArgumentTypeError(f"{value!r}: a whole percent from 1 to 99")
    return int(value)


def _ramp(value: str) -> float:
    seconds = parse_duration(value)
    if not isinstance(seconds, float) or not 1 <= seconds <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"{value!r}: a duration from 1s to 168h, such as 10m")
    return seconds


def cmd_deploy(args: argparse.Namespace) -> int:
    if args.image is not None:
        if args.app_dir is not None or args.name is None:
            raise CliError("deploy --image REF needs --name APP, and no APP_DIR")
        try:
            definition = image_definition(args.image, args.name, args.port)
        except ValidationError as exc:
            raise CliError(f"deploy --image: {describe_validation_error(exc)}") from exc
        app_dir = AppDir(Path.cwd(), definition)
    elif args.app_dir is None or args.name is not None or args.port is not None:
        raise CliError("deploy needs APP_DIR (or --image REF --name APP [--port N])")
    else:
        (app_dir,) = load_apps([args.app_dir])  # a bad directory is a usage error, found first
    if args.dry_run:
        return build_commands.dry_run(app_dir)
    if args.keep_split and (args.canary or args.ramp):
        raise CliError("deploy --keep-split keeps the split as it is: give no --canary or --ramp")
    how = {"canary": args.canary, "ramp": args.ramp, "keep_split": args.keep_split}
    if app_dir.plan.kind in BUILT_KINDS:
        return _remote(lambda api, _: build_commands.deploy_built(api, app_dir, **how))(args)
    return _remote(lambda api, _: commands.deploy(api, app_dir, **how))(args)


def build_parser() -> argparse.ArgumentParser:
    parser = DiscreetParser(prog="wakeful", description=__doc__.split("\n\n")[0])
    parser.set_defaults(data_dir=".wakeful", api=None, verbose=False)
    # The global flags, accepted before or after the subcommand (`wakeful up --data-dir D`).
    # SUPPRESS: a subcommand sets them only when given there, so it never resets them.
    common = DiscreetParser(add_help=False, argument_default=argparse.SUPPRESS)
    for flags in (parser, common):
        flags.add_argument("--data-dir", help="state directory (default ./.wakeful)")
        flags.add_argument("--api", help="control API URL (default: from --data-dir)")
        flags.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=DiscreetParser)
    add_parser = sub.add_parser
    sub.add_parser = functools.partial(add_parser, parents=[common])  # type: ignore[method-assign]

    up = sub.add_parser("up", help="run everything in one process on the embedded store")
    up.add_argument("app_dirs", nargs="*", metavar="APP_DIR")
    up.add_argument("--listen", default="127.0.0.1:8080", help="ingress address")
    up.add_argument(
        "--api-listen", default="127.0.0.1:8082", help="control API address (host:port)"
    )
    up.add_argument(
        "--admin-listen", default="127.0.0.1:8081", help="ingress admin address (metrics)"
    )
    up.add_argument(
        "--idle-interval",
        type=float,
        default=None,
        help="idle monitor tick, seconds (default WAKEFUL_IDLE_INTERVAL, else 5)",
    )
    isolation_flag(up)
    up.set_defaults(func=cmd_up)

    deploy = sub.add_parser("deploy", help="deploy an app directory, or an image")
    deploy.add_argument("app_dir", metavar="APP_DIR", nargs="?")
    deploy.add_argument(
        "--image",
        help="deploy an OCI image with no directory: registry.example.com/shop:1.4, "
        "oci-archive:FILE or docker-archive:FILE",
    )
    deploy.add_argument("--name", help="the app's name (with --image)")
    deploy.add_argument(
        "--port", type=int, help="the port the image listens on (default: its one EXPOSE)"
    )
    deploy.add_argument(
        "--dry-run",
        action="store_true",
        help="print what APP_DIR is, the Containerfile its build uses and what it runs; "
        "build and send nothing",
    )
    deploy.add_argument(
        "--canary",
        type=_canary,
        default=0,
        metavar="PERCENT",
        help="once ready, the new version takes PERCENT (1-99) of the traffic beside the "
        "active one, and holds there: wakeful promote APP, or wakeful rollback APP",
    )
    deploy.add_argument(
        "--ramp",
        type=_ramp,
        default=0.0,
        metavar="DURATION",
        help="once ready, the new version takes 1%% (or --canary's share), then goes to 100%% "
        "in equal steps over DURATION (10m, 1h); rolled back by itself if it answers worse "
        "than the active one ([rollout] in wakeful.toml)",
    )
    deploy.add_argument(
        "--keep-split",
        action="store_true",
        help="once ready, the new version joins at 0%% and the split (or the active "
        "version's 100%%) stays as it is: send it traffic with wakeful traffic or a tag",
    )
    deploy.set_defaults(func=cmd_deploy)

    status = sub.add_parser("status", help="pool sizes and load")
    status.add_argument("app", nargs="?")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_remote(lambda api, a: commands.status(api, a.app, as_json=a.json)))

    sub.add_parser("apps", help="list apps").set_defaults(
        func=_remote(lambda api, _: commands.apps(api))
    )
    versions = sub.add_parser("versions", help="list an app's versions")
    versions.add_argument("app")
    versions.set_defaults(func=_remote(lambda api, a: commands.versions(api, a.app)))
    logs_parser(sub, _remote)
    certs = sub.add_parser("certs", help="certificates from ACME: state, expiry, last error")
    certs.add_argument("--json", action="store_true")
    certs.set_defaults(func=_remote(lambda api, a: commands.certs(api, as_json=a.json)))
    sub.add_parser("nodes", help="nodes and their drain state").set_defaults(
        func=_remote(lambda api, _: commands.nodes(api))
    )
    drain = sub.add_parser("drain", help="move every sandbox off a node (--undo to uncordon)")
    drain.add_argument("node")
    drain.add_argument(
        "--no-evacuate",
        dest="evacuate",
        action="store_false",
        help="only cordon: take no new sandboxes, keep the ones there",
    )
    drain.add_argument("--undo", action="store_true", help="uncordon the node")
    drain.add_argument(
        "--force", action="store_true", help="cordon a name no node has registered under yet"
    )
    drain.set_defaults(
        func=_remote(
            lambda api, a: commands.drain(
                api, a.node, evacuate=a.evacuate, force=a.force, undo=a.undo
            )
        )
    )
    release = sub.add_parser(
        "release-state",
        help="give up on what a node keeps of a stateful app's state (kept there, or the node "
        "is gone): free it at its last archive",
    )
    release.add_argument("app")
    release.set_defaults(func=_remote(lambda api, a: commands.release_state(api, a.app)))
    delete = sub.add_parser("delete", help="delete an app: its route, versions and sandboxes")
    delete.add_argument("app")
    delete.add_argument(
        "--no-wait", action="store_true", help="return at once; sandboxes stop in the background"
    )
    delete.set_defaults(
        func=_remote(lambda api, a: commands.delete(api, a.app, wait=not a.no_wait))
    )
    rollback = sub.add_parser(
        "rollback",
        help="go back to the previous version (during a split: all traffic to the active one)",
    )
    rollback.add_argument("app")
    rollback.set_defaults(func=_remote(lambda api, a: commands.rollback(api, a.app)))
    traffic_parsers(sub, _remote)
    tokens = sub.add_parser("tokens", help="role tokens: create, list, revoke, rotate")
    _tokens_parser(tokens, common)
    secrets = sub.add_parser("secrets", help="app secrets: set, unset, list; the keys")
    secrets_parser(secrets, common, _remote)
    registry = sub.add_parser(
        "registry", help="registry logins for image pulls: login, logout, list, import"
    )
    registry_parser(registry, common, _remote)

    activator = sub.add_parser("activator", help="the activator and control API (WAKEFUL_*)")
    activator.add_argument(
        "--idle-interval",
        type=float,
        default=None,
        help="idle monitor tick, seconds (default WAKEFUL_IDLE_INTERVAL, else 30)",
    )
    activator.set_defaults(func=cmd_activator)
    activator.add_argument(
        "--no-idle-monitor", action="store_true", help="run `wakeful idle-monitor` apart instead"
    )
    activator.add_argument(
        "--reset-admin-token",
        action="store_true",
        help="make WAKEFUL_TOKEN the admin token even though the store holds another (after "
        "losing a rotated one)",
    )
    node = sub.add_parser("node", help="a node agent (WAKEFUL_*)")
    isolation_flag(node)
    node.set_defaults(func=cmd_node)
    ingress = sub.add_parser("ingress", help="the ingress (WAKEFUL_*)")
    ingress.add_argument(
        "--workers",
        metavar="N|auto",
        help="ingress processes sharing the client port, each a replica (WAKEFUL_INGRESS_WORKERS;"
        " default 1; auto: one per core)",
    )
    ingress.set_defaults(func=cmd_ingress)
    sub.add_parser("idle-monitor", help="the idle monitor (WAKEFUL_*)").set_defaults(
        func=cmd_idle_monitor
    )
    sub.add_parser(
        "etcd-auth", help="etcd users and roles per piece, then authentication on (WAKEFUL_*)"
    ).set_defaults(func=cmd_etcd_auth)
    saved = sub.add_parser(
        "backup",
        help="every record of the store (WAKEFUL_STORE_URL, else --data-dir's) into FILE",
    )
    saved.add_argument("file", metavar="FILE")
    saved.set_defaults(func=cmd_backup)
    back = sub.add_parser(
        "restore", help="a backup into an empty store (WAKEFUL_STORE_URL, else --data-dir's)"
    )
    back.add_argument("file", metavar="FILE")
    back.set_defaults(func=cmd_restore)
    return parser


def _tokens_parser(tokens: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`wakeful tokens ...`: each subcommand takes the global flags (`common`) too."""
    sub = tokens.add_subparsers(dest="tokens_command", required=True)
    create = sub.add_parser(
        "create", parents=[common], help="a new token; prints its secret, this once"
    )
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--name", required=True, type=token_name, help="e.g. the node's name")
    create.set_defaults(func=_remote(lambda api, a: commands.tokens_create(api, a.name, a.role)))
    listing = sub.add_parser("list", parents=[common], help="name, role, created, id")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=_remote(lambda api, a: commands.tokens_list(api, as_json=a.json)))
    revoke = sub.add_parser("revoke", parents=[common], help="the token stops working")
    revoke.add_argument("name", type=token_name)
    revoke.set_defaults(func=_remote(lambda api, a: commands.tokens_revoke(api, a.name)))
    rotate = sub.add_parser(
        "rotate", parents=[common], help="a new secret; the old one stops working"
    )
    rotate.add_argument("name", type=token_name)
    rotate.set_defaults(func=_remote(lambda api, a: commands.tokens_rotate(api, a.name)))
    sub.add_parser(
        "rotate-admin",
        parents=[common],
        help="a new admin token: into DATA_DIR/token for `wakeful up`, else printed",
    ).set_defaults(func=_remote(lambda api, _: commands.tokens_rotate(api, ADMIN_TOKEN)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "registry":  # it may be a password typed as an argument
        parser.error(
            f"{len(extra)} unrecognized argument(s), not shown: a registry password is read "
            "from standard input, never an argument"
        )
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _configure_logging(args.verbose)
    try:
        code: int = args.func(args)
    except CliError as exc:
        commands.note(f"error: {exc}")
        return exc.code
    except ControlApiError as exc:  # nothing to talk to, no answer, or a refusal
        commands.note(f"error: {exc}")  # a refusal's detail can quote an app's value
        return RUNTIME
    except ValidationError as exc:  # settings from WAKEFUL_* variables
        commands.note(f"error: {describe_settings_error(exc)}")
        return USAGE
    except SettingsError as exc:  # a variable pydantic-settings could not even parse
        commands.note(f"error: {describe_unparsed(exc)}")
        return USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `wakeful ... | head`: the reader left; nothing more to say
        _quiet_stdout()
        return RUNTIME
    return code


def describe_settings_error(exc: ValidationError) -> str:
    """Settings' fields by the variables that set them (`listen`: `WAKEFUL_LISTEN`); a check
    of the settings as a whole by its message alone."""
    if not exc.title.endswith("Settings"):
        return describe_validation_error(exc)
    lines = []
    for line in describe_validation_error(exc).split("; "):
        where, sep, rest = line.partition(": ")
        if where == "value":
            lines.append(rest)
        elif sep and re.fullmatch(r"[a-z0-9_]+(\.[A-Za-z0-9_]+)*", where):
            field, dot, inner = where.partition(".")
            lines.append(f"WAKEFUL_{field.upper()}{dot}{inner}: {rest}")
        else:
            lines.append(line)
    return "; ".join(lines)


def describe_unparsed(exc: SettingsError) -> str:
    """`error parsing value for field "tls_redirect" from source ...` as the variable, and
    what the parser said."""
    found = re.search(r'field "([a-z0-9_]+)"', str(exc))
    name = f"WAKEFUL_{found.group(1).upper()}" if found else "a WAKEFUL_* variable"
    why = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return f'{name}: cannot be read{why}: a list or a table is JSON, such as ["a", "b"]'


def _quiet_stdout() -> None:
    """stdout pointed at /dev/null: Python's flush of it at exit would fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
