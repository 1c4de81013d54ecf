"""`wakeful logs`: an app's output and access log from the control plane's log directory
(issue 40; docs/design/logs.md), the command and its parser.

The answer is printed as it streams in. `-f` asks again every `POLL` seconds for what came
since a little before the newest line it printed (`OVERLAP`: an ingress's access lines carry
its own clock and arrive up to a report late), and prints only lines it has not printed
(lines older than the oldest of the first answer were left out of it by `--tail`, and stay
out): lines are told apart by their whole record, so none is printed twice. While the
control plane is out of reach or busy (a takeover, a 503), `-f` says so once and asks again.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from .commands import CliError, Pause, note, say, say_json
from .domain.logfiles import KINDS, Kind, line_text, parse_time, short_time
from .domain.shown import shown
from .remote import ApiRefused, ApiUnreachable, ControlClient

Command = Callable[[argparse.Namespace], int]
Remote = Callable[[Callable[[ControlClient, argparse.Namespace], int]], Command]
POLL = 1.0
OVERLAP = 10.0
"""Seconds before the newest line printed that each `-f` poll reads again."""


def logs(
    api: ControlClient,
    app: str,
    *,
    tail: int | None = None,
    since: str | None = None,
    until: str | None = None,
    grep: str | None = None,
    sandbox: str | None = None,
    version: str | None = None,
    kind: Kind = "output",
    follow: bool = False,
    as_json: bool = False,
    pause: Pause = time.sleep,
    clock: Callable[[], float] = time.time,
) -> int:
    """The lines asked for, oldest first: the last `tail` (200 when neither it nor `since` is
    given), or every one since `since`. What an app controls is shown with its control
    characters as escapes; `as_json` prints the records exact. A note on stderr says when some
    output has not arrived (a node not heard from lately, output still buffered or lost)."""
    now = clock()
    bounds: dict[str, float] = {}
    for name, value in (("--since", since), ("--until", until)):
        if value is not None:
            try:
                bounds[name] = parse_time(value, now)  # refused here, naming the flag
            except ValueError as exc:
                raise CliError(f"{name}: {exc}") from None
    if len(bounds) == 2 and bounds["--until"] < bounds["--since"]:
        raise CliError(f"--until {until} is before --since {since}: no line could be in it")
    query: dict[str, Any] = {"until": until, "grep": grep, "sandbox": sandbox}
    query |= {"version": version, "kind": kind}
    seen = _Seen(as_json, kind)
    noted = ""
    asked: dict[str, Any] = {"tail": tail, "since": since}
    failing = ""
    while True:
        try:
            with api.app_logs(app, **asked, **query) as answer:
                if answer.behind and answer.behind != noted:
                    note(f"note: logs behind: {answer.behind}")
                noted = answer.behind
                for record in answer.records:
                    seen.show(record, follow)
        except (ApiUnreachable, ApiRefused) as exc:
            # Following through a takeover or a busy moment: say so once, ask again.
            transient = isinstance(exc, ApiUnreachable) or exc.status in (502, 503, 504)
            if not follow or not transient:
                raise
            if str(exc) != failing:
                note(f"note: {exc}; asking again")
            failing = str(exc)
        else:
            failing = ""
            if not follow:
                return 0
            if "tail" in asked and (tail is not None or since is None):
                seen.floor = seen.first  # what --tail left out stays out
            start = (seen.newest if seen.newest is not None else clock()) - OVERLAP
            asked = {"since": f"{start:.6f}"}
            seen.forget()
        pause(POLL)


class _Seen:
    """What `-f` printed lately (each record whole, with its time), so a poll prints only
    what it has not."""

    def __init__(self, as_json: bool, kind: Kind) -> None:
        self._as_json = as_json
        self._kind = kind
        self._printed: dict[str, float] = {}
        self.newest: float | None = None
        self.first: float | None = None
        """The time of the first line printed: the oldest the first answer held."""
        self.floor: float | None = None

    def show(self, record: dict[str, Any], follow: bool) -> None:
        raw = json.dumps(record, sort_keys=True)
        if raw in self._printed:
            return
        ts = record.get("ts")
        at = float(ts) if isinstance(ts, int | float) else 0.0
        if self.floor is not None and at < self.floor:
            return
        if self.first is None:
            self.first = at
        if follow:
            self._printed[raw] = at
            self.newest = at if self.newest is None else max(self.newest, at)
        _print(record, self._kind, self._as_json)

    def forget(self) -> None:
        """What no poll reads again."""
        if self.newest is not None:
            horizon = self.newest - 2 * OVERLAP
            self._printed = {raw: at for raw, at in self._printed.items() if at >= horizon}


def _print(record: dict[str, Any], kind: Kind, as_json: bool) -> None:
    if as_json:
        say_json(record)
    else:
        say(f"{short_time(record)} {shown(line_text(record, kind))}")


def logs_parser(sub: Any, remote: Remote) -> None:
    """The command, added to `wakeful`'s own subcommands (`sub`)."""
    parser = sub.add_parser(
        "logs",
        help="an app's output (or --access, its access log) from the control plane's log",
    )
    parser.add_argument("app")
    parser.add_argument("--follow", "-f", action="store_true", help="then print new lines")
    parser.add_argument(
        "--tail", type=int, default=None, help="the last N lines (200 without --since)"
    )
    parser.add_argument("--since", help="from then on: 90s, 15m, 1h, 2d ago, or a time")
    parser.add_argument("--until", help="up to then: as --since")
    parser.add_argument("--grep", help="only lines holding this text")
    parser.add_argument("--sandbox", help="only this sandbox's lines")
    parser.add_argument("--version", help="only this version's lines")
    parser.add_argument(
        "--access", action="store_true", help="the access log: one line per proxied request"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="JSON Lines, the records field for field: the exact text, control characters "
        "and all (without it they are shown as escapes, e.g. \\x1b)",
    )

    def run(api: ControlClient, a: argparse.Namespace) -> int:
        if a.tail is not None and not 1 <= a.tail <= 10_000:
            raise CliError(f"--tail: from 1 to 10000 (got {a.tail})")
        for flag in ("app", "since", "until", "grep", "sandbox", "version"):
            value = getattr(a, flag)
            try:
                value is None or value.encode()
            except UnicodeEncodeError:  # bytes the terminal's encoding could not decode
                name = "APP" if flag == "app" else f"--{flag}"
                raise CliError(f"{name}: not UTF-8 text (got {value!r})") from None
        return logs(
            api,
            a.app,
            tail=a.tail,
            since=a.since,
            until=a.until,
            grep=a.grep,
            sandbox=a.sandbox,
            version=a.version,
            kind=KINDS[1] if a.access else KINDS[0],
            follow=a.follow,
            as_json=a.json,
        )

    parser.set_defaults(func=remote(run))
