"""The command line's care for secrets: `wakeful secrets set|unset|list|rotate-key|
retire-key`, and the parser whose usage errors never quote a `NAME=VALUE` argument's value
(`DiscreetParser`), which the whole command line uses."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import NoReturn

from wakeful.domain.models import KEY_ID_PATTERN, NAME_PATTERN

from . import commands
from .remote import ControlClient

Command = Callable[[argparse.Namespace], int]


ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=\S*")


class DiscreetParser(argparse.ArgumentParser):
    """argparse, whose usage errors quote what they refuse, except a `NAME=VALUE` argument's
    value: it may be a secret typed where it did not belong (`wakeful secrets set APP A=1
    --bogus B=secret` is refused as "unrecognized arguments: --bogus B=…")."""

    def error(self, message: str) -> NoReturn:
        super().error(ASSIGNMENT.sub(r"\1=…", message))


def token_name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a token name: lowercase letters, digits and '-', 1 to 63 "
            "characters, starting and ending with a letter or digit"
        )
    return value


def secrets_key_id(value: str) -> str:
    if not re.fullmatch(KEY_ID_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a secrets key id: 12 hex digits")
    return value


def _secrets_set(api: ControlClient, args: argparse.Namespace) -> int:
    assignments = [a for a in args.assignments if a != "--no-restart"]
    restart = not args.no_restart and len(assignments) == len(args.assignments)
    return commands.secrets_set(api, args.app, assignments, restart=restart)


def secrets_parser(
    secrets: argparse.ArgumentParser,
    common: DiscreetParser,
    remote: Callable[[Callable[[ControlClient, argparse.Namespace], int]], Command],
) -> None:
    """`wakeful secrets ...`. NAME=VALUE arguments are read by `commands.secret_assignments`,
    not by argparse, whose errors would quote them."""
    sub = secrets.add_subparsers(dest="secrets_command", required=True, parser_class=DiscreetParser)
    no_restart = DiscreetParser(add_help=False)
    no_restart.add_argument(
        "--no-restart",
        action="store_true",
        help="leave running sandboxes as they are; they get the change when next started",
    )
    set_ = sub.add_parser(
        "set",
        parents=[common, no_restart],
        help="set secrets (VALUE `-`: read from stdin); restarts the app's sandboxes",
    )
    set_.add_argument("app", type=token_name, metavar="APP")
    # Everything after APP, read by `secret_assignments`: `--no-restart` may come after the
    # assignments too, as people type it.
    set_.add_argument("assignments", nargs=argparse.REMAINDER, metavar="NAME=VALUE ...")
    set_.set_defaults(func=remote(_secrets_set))
    unset = sub.add_parser(
        "unset", parents=[common, no_restart], help="unset secrets; restarts the app's sandboxes"
    )
    unset.add_argument("app", type=token_name, metavar="APP")
    unset.add_argument("names", nargs="+", metavar="NAME")
    unset.set_defaults(
        func=remote(
            lambda api, a: commands.secrets_unset(api, a.app, a.names, restart=not a.no_restart)
        )
    )
    listing = sub.add_parser("list", parents=[common], help="names, when set, by whom: no value")
    listing.add_argument("app", type=token_name, metavar="APP")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(
        func=remote(lambda api, a: commands.secrets_list(api, a.app, as_json=a.json))
    )
    sub.add_parser(
        "rotate-key",
        parents=[common],
        help="a new key, current at once; every value sealed again under it (no restart)",
    ).set_defaults(func=remote(lambda api, _: commands.secrets_rotate_key(api)))
    retire = sub.add_parser(
        "retire-key", parents=[common], help="delete a key no value is sealed under any more"
    )
    retire.add_argument("key_id", type=secrets_key_id, metavar="ID")
    retire.set_defaults(func=remote(lambda api, a: commands.secrets_retire_key(api, a.key_id)))
