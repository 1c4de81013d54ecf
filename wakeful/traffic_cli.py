"""`wakeful traffic|promote|tag|untag`: an app's traffic between its versions (issue 39;
docs/design/traffic.md), the commands and their parsers. `deploy --canary/--ramp/--keep-split`
are `deploy`'s flags (`wakeful.cli`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .commands import CliError, say, say_json
from .remote import ControlClient
from .tables import traffic_table

Command = Callable[[argparse.Namespace], int]
Remote = Callable[[Callable[[ControlClient, argparse.Namespace], int]], Command]


def traffic(api: ControlClient, app: str, split: Sequence[str], *, as_json: bool) -> int:
    """The app's split and tags; with `VERSION=PERCENT ...`, set first."""
    report = api.set_traffic(app, split) if split else api.traffic(app)
    return _show_traffic(report, as_json)


def promote(api: ControlClient, app: str) -> int:
    return _show_traffic(api.promote(app), False)


def tag(api: ControlClient, app: str, version: str, name: str) -> int:
    if not name:
        raise CliError("TAG is empty: give the tag's name (a DNS label, e.g. beta)")
    return _show_traffic(api.tag(app, name, version), False)


def untag(api: ControlClient, app: str, name: str) -> int:
    if not name:
        raise CliError("TAG is empty: give the tag's name")
    return _show_traffic(api.untag(app, name), False)


def _show_traffic(report: Mapping[str, Any], as_json: bool) -> int:
    if as_json:
        say_json(report, indent=2)
        return 0
    for line in traffic_table(report):
        say(line)
    return 0


def traffic_parsers(sub: Any, remote: Remote) -> None:
    """The four commands, added to `wakeful`'s own subcommands (`sub`)."""
    showing = sub.add_parser(
        "traffic", help="show an app's split and tags, or set it: APP v7=90 v8=10 (latest=...)"
    )
    showing.add_argument("app")
    showing.add_argument("split", nargs="*", metavar="VERSION=PERCENT")
    showing.add_argument("--json", action="store_true")
    showing.set_defaults(func=remote(lambda api, a: traffic(api, a.app, a.split, as_json=a.json)))
    promoting = sub.add_parser(
        "promote",
        help="all traffic to the split's newest version but the active one (with a share first)",
    )
    promoting.add_argument("app")
    promoting.set_defaults(func=remote(lambda api, a: promote(api, a.app)))
    tagging = sub.add_parser(
        "tag",
        help="TAG--APP.<base domain> reaches VERSION (latest: the newest), whatever the split",
    )
    tagging.add_argument("app")
    tagging.add_argument("version")
    tagging.add_argument("tag")
    tagging.set_defaults(func=remote(lambda api, a: tag(api, a.app, a.version, a.tag)))
    untagging = sub.add_parser("untag", help="remove a tag")
    untagging.add_argument("app")
    untagging.add_argument("tag")
    untagging.set_defaults(func=remote(lambda api, a: untag(api, a.app, a.tag)))
