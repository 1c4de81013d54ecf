"""Which hosts an app may not claim: those reserved for the control plane and the apps' default
hosts (`reserved`), and those another app routes (`conflicts`, `default_host_conflicts`). A
host is exact (`shop.example.com`) or a wildcard (`*.example.com`: one or more labels before
`example.com`, not `example.com` itself), as `wakeful.toml`'s `hosts` spell them; the ingress
routes by the same rules (`wakeful.ingress.routing.match`), `<app>.<base_domain>` first for an
app with its default host.

Two hosts overlap when some request host would match both: equal exact hosts, a wildcard and an
exact host under it, or two wildcards one of whose domains lies under (or is) the other's.

Reserved, because a browser sends the dashboard's session cookie (`Path=/ui`, for the host the
operator logged in at, whatever the port) to an app served under that host on any port:
- a host a browser reads as an IP address: per the WHATWG URL standard, one whose last label is
  a number, decimal or `0x` and hex digits (`127.1`, `0x7f.0.0.1` and `2130706433` are all
  127.0.0.1); no real top-level domain is a number;
- `localhost`;
- the names the control plane answers on (`HostRules.control`), and hosts overlapping them;
- the base domain itself (an app there could set cookies for every app's default host), and a
  wildcard covering its names, which are the apps' default hosts.
The first two need no setting, so `wakeful deploy` checks them before it asks the control plane.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
"""A label the WHATWG URL parser reads as an IPv4 number (`0x` alone is 0)."""
_COOKIE = "a browser would send the dashboard's cookie to an app there"


@dataclass(frozen=True)
class HostRules:
    """What the control plane knows of the names around its apps."""

    base_domain: str = "localhost"
    """`<app>.<base_domain>` is an app's default host: the ingress's `WAKEFUL_BASE_DOMAIN`."""
    control: tuple[str, ...] = ()
    """Names the control plane's API and dashboard answer on."""

    def default_host(self, app: str) -> str:
        return f"{app}.{self.base_domain}".casefold()


class Claim(NamedTuple):
    """The hosts one app routes: its `hosts`, and its default host unless `default_host` is
    false."""

    app: str
    hosts: Sequence[str]
    default_host: bool = True


def _under(host: str, domain: str) -> bool:
    """`host` is `domain` with one or more labels before it."""
    return host.endswith("." + domain)


def overlap(a: str, b: str) -> bool:
    a, b = a.casefold(), b.casefold()
    wild_a, wild_b = a.startswith("*."), b.startswith("*.")
    if wild_a and wild_b:
        da, db = a[2:], b[2:]
        return da == db or _under(da, db) or _under(db, da)
    if wild_a:
        return _under(b, a[2:])
    if wild_b:
        return _under(a, b[2:])
    return a == b


def ends_in_number(host: str) -> bool:
    """A browser parses `host` as an IPv4 address (or refuses it): its last label is a number
    in the WHATWG URL standard's sense, decimal digits or `0x` followed by hex digits."""
    return _NUMBER.fullmatch(host.casefold().removesuffix(".").rpartition(".")[2]) is not None


def reserved(host: str, rules: HostRules | None = None) -> str | None:
    """Why no app may claim `host`, in one line that names it, or None. Without `rules`, only
    the reasons that need no setting (an IP address, `localhost`)."""
    host = host.casefold()
    if ends_in_number(host):
        return (
            f"{host} is reserved: a browser reads it as an IP address, and an IP address "
            "reaches the control plane's dashboard, whose cookie the browser would send to "
            "this app"
        )
    if host == "localhost":
        return (
            f"{host} is reserved: it reaches the control plane's dashboard, whose cookie a "
            "browser would send to this app"
        )
    if rules is None:
        return None
    base = rules.base_domain.casefold()
    if host == base:
        return (
            f"{host} is reserved: it is the base domain (WAKEFUL_BASE_DOMAIN), and an app "
            "there could set cookies for every app's default host"
        )
    if host.startswith("*.") and (host[2:] == base or _under(base, host[2:])):
        return f"{host} is reserved: it covers the apps' default hosts (<app>.{base})"
    for name in rules.control:
        name = name.casefold()
        if host == name:
            return f"{host} is reserved: the control plane answers on it, and {_COOKIE}"
        if overlap(host, name):
            return (
                f"{host} is reserved: it overlaps {name}, where the control plane answers, "
                f"and {_COOKIE}"
            )
    return None


def conflicts(
    app: str, hosts: Iterable[str], others: Iterable[tuple[str, Iterable[str]]]
) -> list[str]:
    """One line per pair of `app`'s `hosts` and another app's that overlap, naming both."""
    found = []
    mine = list(hosts)
    for other, theirs in others:
        if other == app:
            continue
        for claimed in theirs:
            for host in mine:
                if overlap(host, claimed):
                    found.append(f"host {host} of {app} overlaps host {claimed} of app {other}")
    return found


def within(host: str, default: str) -> bool:
    """`host` (exact or wildcard) names `default` or a name under it. A name under an app's
    default host gets that app's cookies (`Domain=hello.localhost` reaches `a.hello.localhost`),
    so it is the app's as much as the default host itself is."""
    host = host.casefold()
    if host.startswith("*."):
        return host[2:] == default or _under(host[2:], default) or _under(default, host[2:])
    return host == default or _under(host, default)


def default_host_conflicts(claim: Claim, others: Iterable[Claim], base_domain: str) -> list[str]:
    """One line per host of `claim` that is another app's default host (or a name under it,
    or a wildcard covering it), and per host of another app that is so for `claim`'s default
    host, naming both apps. The ingress routes a default host before any app's `hosts`, so
    one app would silently lose it; and a name under it would get its app's cookies."""
    found = []
    mine = f"{claim.app}.{base_domain}".casefold()
    for other in others:
        if other.app == claim.app:
            continue
        if other.default_host:
            theirs = f"{other.app}.{base_domain}".casefold()
            found += [
                f"host {host} of {claim.app} overlaps {theirs}, the default host of app {other.app}"
                for host in claim.hosts
                if within(host, theirs)
            ]
        if claim.default_host:
            found += [
                f"the default host {mine} of {claim.app} overlaps host {host} of app {other.app}"
                for host in other.hosts
                if within(host, mine)
            ]
    return found


def refusal(claim: Claim, others: Sequence[Claim], rules: HostRules) -> str | None:
    """Why `claim` may not be routed, in one line, or None: its reserved hosts if it has any,
    else every clash with another app's hosts or default host, naming both apps."""
    why = [f"hosts: {reason}" for reason in (reserved(h, rules) for h in claim.hosts) if reason]
    if claim.default_host:
        reason = reserved(rules.default_host(claim.app), rules)
        if reason is not None:
            why.append(f"default_host: {reason} (set default_host = false)")
    if why:
        return "; ".join(why)
    clashes = conflicts(claim.app, claim.hosts, ((o.app, o.hosts) for o in others))
    defaults = default_host_conflicts(claim, others, rules.base_domain)
    if not clashes and not defaults:
        return None
    why = [*clashes, *defaults]
    hint = ""
    if defaults:
        hint = (
            f" (an app's default host is <app>.{rules.base_domain} unless it sets "
            "default_host = false)"
        )
    return "; ".join(why) + ": a host routes to one app only" + hint
