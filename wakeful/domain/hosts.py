"""Which hosts two apps may not both claim. A host is exact (`shop.example.com`) or a wildcard
(`*.example.com`: one or more labels before `example.com`, not `example.com` itself), as
`wakeful.toml`'s `hosts` spell them; the ingress routes by the same rules
(`wakeful.ingress.routing.match`).

Two hosts overlap when some request host would match both: equal exact hosts, a wildcard and an
exact host under it, or two wildcards one of whose domains lies under (or is) the other's.
"""

from __future__ import annotations

from collections.abc import Iterable


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
