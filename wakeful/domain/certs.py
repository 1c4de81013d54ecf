"""Which names get certificates from ACME, and when each is ordered: pure, `now` a parameter.

Rules:
- **Names.** Exactly the exact names in deployed apps' `hosts`, and `<app>.<base domain>` for
  an app with its default host when a public base domain is set (`WAKEFUL_ACME_BASE_DOMAIN`).
  Never a name seen only in a handshake or a `Host` header: nothing here takes one. Wildcard
  hosts need DNS-01 and are skipped (served from files); so are names a public CA never
  issues for (`localhost`, a number-only last label), names no DNS can hold (over 253
  characters: a long base domain and a long app name), and names a certificate file covers
  (files win for their names).
- **When.** A name with no certificate is ordered at once; one with a certificate at two
  thirds of its lifetime, or at once when another ACME directory issued it (staging's, before
  production's). A failed attempt waits `retry_after(failures)`: 1, 5, 15 minutes, 1 hour,
  3 hours, then 6 hours each time, which keeps a name under Let's Encrypt's 5 failed
  validations per name per account per hour however long it fails.
- **Pace.** At most `limit` orders start in any `ORDER_WINDOW` (3 hours): Let's Encrypt
  allows 300 new orders per account per 3 hours, and a control plane coming up with
  thousands of apps must not spend them in a minute (`order_wait`).
- **Gone.** A name no app routes any more is dropped: its record deleted, never renewed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

from .models import CertRecord, CertState

RETRIES = (60.0, 300.0, 900.0, 3600.0, 3 * 3600.0, 6 * 3600.0)
"""Seconds to wait after the 1st, 2nd, ... failure in a row; the last one thereafter."""
ORDER_WINDOW = 3 * 3600.0
"""The window of the CA's limit on new orders per account."""
RENEW_AT = 2 / 3
"""The share of a certificate's lifetime after which it is renewed."""


@dataclass(frozen=True)
class Routed:
    """What an app routes, as the certificate manager reads it from `apps/{app}`."""

    app: str
    hosts: tuple[str, ...]
    default_host: bool
    tags: tuple[str, ...] = ()
    """The app's tags: `TAG--APP.<base domain>` is a name of its too (issue 39)."""


MAX_NAME = 253
"""A DNS name's bound: `<app>.<base domain>` can pass it with a long base domain."""


def _public(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return (
        "." in name
        and len(name) <= MAX_NAME
        and all(0 < len(label) <= 63 for label in name.split("."))
        and name != "localhost"
        and not last.isdigit()
        and last != "localhost"
    )


def wanted_names(
    apps: Iterable[Routed], base_domain: str | None, files: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Each name to hold a certificate for, with the app that routes it."""
    wanted: dict[str, str] = {}
    for routed in sorted(apps, key=lambda r: r.app):
        names = [h.lower() for h in routed.hosts if not h.startswith("*.")]
        if base_domain and routed.default_host:
            names.append(f"{routed.app}.{base_domain}".lower())
        if base_domain:
            names += [f"{tag}--{routed.app}.{base_domain}".lower() for tag in routed.tags]
        for name in names:
            if _public(name) and not covered_by_file(name, files):
                wanted.setdefault(name, routed.app)
    return wanted


def covered_by_file(name: str, files: frozenset[str]) -> bool:
    """`files`: the names certificate files serve (`shop.example.com`, `*.example.com`)."""
    return name in files or ("." in name and "*." + name.split(".", 1)[1] in files)


def retry_after(failures: int) -> float:
    """Seconds before another attempt after `failures` failed ones in a row (>= 1)."""
    return RETRIES[min(max(failures, 1), len(RETRIES)) - 1]


def renew_at(record: CertRecord) -> float:
    """When the certificate a record holds is due for renewal (0: it holds none)."""
    issued = record.issued
    if issued is None:
        return 0.0
    return issued.not_before + (issued.not_after - issued.not_before) * RENEW_AT


def due(record: CertRecord | None, now: float, directory: str = "") -> bool:
    """Whether an order for this name should start now; `directory`: the ACME directory in
    use (a certificate another one issued, say staging's, is replaced at once)."""
    if record is None:
        return True
    issued = record.issued
    if issued is not None and issued.directory and directory and issued.directory != directory:
        return record.next_attempt <= now
    if record.next_attempt > now:
        return False
    if record.state in (CertState.ORDERING, CertState.RENEWING, CertState.FAILING):
        return True  # unfinished (a leader left it), or failed and its wait is over
    return now >= renew_at(record)


def next_check(records: Iterable[CertRecord], now: float, ceiling: float) -> float:
    """Seconds until some record is due (at most `ceiling`: apps change too)."""
    soonest = now + ceiling
    for record in records:
        at = max(record.next_attempt, renew_at(record) if record.issued else 0.0)
        soonest = min(soonest, at)
    return max(0.0, soonest - now)


def ordering(record: CertRecord | None, name: str, app: str, now: float) -> CertRecord:
    """The record as an order for `name` (routed by `app`) starts: `renewing` while it holds
    a certificate that has not expired, else `ordering`."""
    issued = record.issued if record is not None else None
    live = issued is not None and issued.not_after > now
    return CertRecord(
        name=name,
        app=app,
        state=CertState.RENEWING if live else CertState.ORDERING,
        issued=issued,
        failures=record.failures if record is not None else 0,
        last_error=record.last_error if record is not None else "",
        updated_at=now,
    )


def failed(record: CertRecord, error: str, now: float) -> CertRecord:
    """The record after an attempt failed with `error`: the old certificate kept."""
    failures = record.failures + 1
    return record.model_copy(
        update={
            "state": CertState.FAILING,
            "failures": failures,
            "last_error": error[:2000],
            "next_attempt": now + retry_after(failures),
            "updated_at": now,
        }
    )


def order_wait(started: Iterable[float], now: float, limit: int) -> float:
    """Seconds before another order may start, given when the orders of the last
    `ORDER_WINDOW` started: 0 while fewer than `limit` did."""
    recent = sorted(at for at in started if at > now - ORDER_WINDOW)
    if len(recent) < limit:
        return 0.0
    return recent[len(recent) - limit] + ORDER_WINDOW - now


def gone(records: Mapping[str, CertRecord], wanted: Mapping[str, str]) -> list[str]:
    """The names with a record that no app routes any more."""
    return sorted(name for name in records if name not in wanted)


@dataclass(frozen=True)
class PassPlan:
    """What one pass of the certificate manager does."""

    drop: list[str]
    """Names no app routes any more (and not being ordered): their records go."""
    start: list[tuple[str, str]]
    """(name, app) to order now."""
    wait: float
    """Seconds until the next pass is needed (an app change or an order's end comes sooner)."""


def plan_pass(
    wanted: Mapping[str, str],
    records: Mapping[str, CertRecord],
    ordering: Set[str],
    started: Iterable[float],
    now: float,
    *,
    directory: str,
    limit: int,
    ceiling: float,
) -> PassPlan:
    """One pass, from the wanted names (`wanted_names`), the records, the names being ordered,
    when this leader's recent orders started, and `now`. A name being ordered is neither
    started again nor waited for (its order's end starts a pass: waiting for it would be a
    wait of 0, a spin); past the pace nothing starts and the pass waits for the pace."""
    drop = [name for name in gone(records, wanted) if name not in ordering]
    recent = [at for at in started if at > now - ORDER_WINDOW]
    start: list[tuple[str, str]] = []
    for name, app in wanted.items():
        if name in ordering or not due(records.get(name), now, directory):
            continue
        paced = order_wait(recent, now, limit)
        if paced > 0:
            return PassPlan(drop, start, paced)
        recent.append(now)
        start.append((name, app))
    busy = set(ordering) | {name for name, _ in start}
    idle = [r for name, r in records.items() if name in wanted and name not in busy]
    return PassPlan(drop, start, next_check(idle, now, ceiling))
