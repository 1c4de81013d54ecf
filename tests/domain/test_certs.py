"""Which names get certificates from ACME, and when each is ordered (`wakeful.domain.certs`)."""

from __future__ import annotations

import pytest

from wakeful.domain import certs as rules
from wakeful.domain.models import CertRecord, CertState, Issued

DAY = 86_400.0
PRODUCTION = "https://acme-v02.api.letsencrypt.org/directory"
STAGING = "https://acme-staging-v02.api.letsencrypt.org/directory"


def issued(not_before: float = 0.0, days: float = 90.0) -> Issued:
    return Issued(
        chain="-----BEGIN CERTIFICATE-----",
        not_before=not_before,
        not_after=not_before + days * DAY,
        issuer="CN=test",
        serial="1",
    )


def record(state: CertState = CertState.VALID, **fields: object) -> CertRecord:
    return CertRecord.model_validate({"name": "shop.test", "state": state, **fields})


@pytest.mark.parametrize(
    ("apps", "base", "files", "wanted"),
    [
        pytest.param(
            [rules.Routed("shop", ("shop.test", "www.shop.test"), True)],
            None,
            frozenset(),
            {"shop.test": "shop", "www.shop.test": "shop"},
            id="exact hosts, no base domain: the default host is not ordered",
        ),
        pytest.param(
            [rules.Routed("shop", ("*.shop.test",), True)],
            None,
            frozenset(),
            {},
            id="a wildcard host needs DNS-01: skipped",
        ),
        pytest.param(
            [rules.Routed("shop", (), True), rules.Routed("blog", (), False)],
            "apps.example.com",
            frozenset(),
            {"shop.apps.example.com": "shop"},
            id="the base domain orders each app's default host, unless it has none",
        ),
        pytest.param(
            [rules.Routed("shop", ("localhost", "shop.localhost", "a.b.1", "single"), True)],
            "localhost",
            frozenset(),
            {},
            id="names no public CA issues for are skipped",
        ),
        pytest.param(
            [rules.Routed("a" * 20, (), True), rules.Routed("b", (), True)],
            ".".join(["d" * 59] * 4) + ".test",
            frozenset(),
            {"b." + ".".join(["d" * 59] * 4) + ".test": "b"},
            id="a default host over 253 characters is skipped",
        ),
        pytest.param(
            [rules.Routed("shop", ("shop.test", "a.files.test", "b.test"), True)],
            None,
            frozenset({"shop.test", "*.files.test"}),
            {"b.test": "shop"},
            id="names certificate files cover are left to the files",
        ),
        pytest.param(
            [rules.Routed("b", ("Shop.Test",), True), rules.Routed("a", ("shop.test",), True)],
            None,
            frozenset(),
            {"shop.test": "a"},
            id="lowercased, one name once",
        ),
        pytest.param(
            [rules.Routed("shop", (), False, ("beta",)), rules.Routed("blog", (), True, ("x",))],
            "apps.example.com",
            frozenset(),
            {
                "beta--shop.apps.example.com": "shop",
                "blog.apps.example.com": "blog",
                "x--blog.apps.example.com": "blog",
            },
            id="a tag's host under the base domain, with or without the default host",
        ),
        pytest.param(
            [rules.Routed("shop", ("shop.test",), True, ("beta",))],
            None,
            frozenset(),
            {"shop.test": "shop"},
            id="no base domain: no tag's host",
        ),
    ],
)
def test_wanted_names(
    apps: list[rules.Routed], base: str | None, files: frozenset[str], wanted: dict[str, str]
) -> None:
    assert rules.wanted_names(apps, base, files) == wanted


@pytest.mark.parametrize(
    ("found", "now", "due"),
    [
        pytest.param(None, 0.0, True, id="no record: ordered at once"),
        pytest.param(record(issued=issued()), 59 * DAY, False, id="valid before 2/3 of 90 days"),
        pytest.param(record(issued=issued()), 60 * DAY, True, id="valid at 2/3: renewed"),
        pytest.param(
            record(CertState.FAILING, issued=issued(), failures=1, next_attempt=100.0),
            99.0,
            False,
            id="failing: waits for its next attempt",
        ),
        pytest.param(
            record(CertState.FAILING, failures=1, next_attempt=100.0),
            100.0,
            True,
            id="failing: tries again once the wait is over",
        ),
        pytest.param(
            record(CertState.ORDERING), 0.0, True, id="ordering, left by a deposed leader"
        ),
        pytest.param(
            record(CertState.RENEWING, issued=issued()), 1.0, True, id="renewing, left too"
        ),
        pytest.param(
            record(issued=issued().model_copy(update={"directory": STAGING})),
            1.0,
            True,
            id="valid, but from another directory (staging): replaced at once",
        ),
        pytest.param(
            record(issued=issued().model_copy(update={"directory": PRODUCTION})),
            1.0,
            False,
            id="valid, from the directory in use",
        ),
    ],
)
def test_due(found: CertRecord | None, now: float, due: bool) -> None:
    assert rules.due(found, now, PRODUCTION) is due


def test_failures_back_off_and_stay_under_five_an_hour_however_long_they_last() -> None:
    now, attempts = 0.0, []
    current = record(CertState.ORDERING)
    for _ in range(40):
        attempts.append(now)
        current = rules.failed(current, "validation failed", now)
        now = current.next_attempt
    for start in attempts:
        assert sum(1 for at in attempts if start <= at < start + 3600) <= 5
    assert [rules.retry_after(n) for n in (1, 2, 3, 4, 7, 40)] == [
        60.0,
        300.0,
        900.0,
        3600.0,
        6 * 3600.0,
        6 * 3600.0,
    ]


def test_a_failure_keeps_the_certificate_served_and_says_why() -> None:
    before = rules.ordering(record(issued=issued()), "shop.test", "shop", now=61 * DAY)
    assert before.state is CertState.RENEWING and before.issued is not None
    after = rules.failed(before, "connection refused", now=61 * DAY)
    assert after.state is CertState.FAILING and after.issued == before.issued
    assert after.failures == 1 and after.last_error == "connection refused"
    assert after.next_attempt == 61 * DAY + 60


def test_an_expired_certificate_orders_rather_than_renews() -> None:
    assert rules.ordering(record(issued=issued()), "shop.test", "shop", 91 * DAY).state is (
        CertState.ORDERING
    )


def test_names_no_app_routes_are_dropped_and_the_next_check_is_the_soonest_due() -> None:
    records = {"shop.test": record(issued=issued()), "old.test": record(issued=issued())}
    assert rules.gone(records, {"shop.test": "shop"}) == ["old.test"]
    waiting = record(CertState.FAILING, failures=1, next_attempt=10 * DAY)
    assert rules.next_check([record(issued=issued()), waiting], 0.0, 30 * DAY) == 10 * DAY
    assert rules.next_check([record(issued=issued())], 0.0, 60.0) == 60.0


@pytest.mark.parametrize(
    ("started", "now", "limit", "wait"),
    [
        pytest.param([], 0.0, 2, 0.0, id="none started: go"),
        pytest.param([10.0], 20.0, 2, 0.0, id="under the limit: go"),
        pytest.param([10.0, 15.0], 20.0, 2, 10_790.0, id="at the limit: until the oldest ages out"),
        pytest.param([10.0, 15.0, 18.0], 20.0, 2, 10_800.0 + 15 - 20, id="the limit-th newest"),
        pytest.param([0.0, 15.0], 10_801.0, 2, 0.0, id="one aged out of the 3 hours: go"),
    ],
)
def test_orders_are_paced_within_the_cas_limit_per_3_hours(
    started: list[float], now: float, limit: int, wait: float
) -> None:
    assert rules.order_wait(started, now, limit) == wait


@pytest.mark.parametrize(
    ("records", "ordering", "started", "drop", "start", "wait"),
    [
        pytest.param({}, set(), [], [], [("shop.test", "shop")], 60.0, id="new: ordered"),
        pytest.param(
            {"shop.test": record(CertState.ORDERING)},
            {"shop.test"},
            [0.0],
            [],
            [],
            60.0,
            id="being ordered: not again, and not waited for (its end starts a pass)",
        ),
        pytest.param(
            {"shop.test": record(issued=issued())},
            set(),
            [],
            [],
            [],
            60.0,
            id="valid, renewal far off: the ceiling",
        ),
        pytest.param(
            {"shop.test": record(CertState.FAILING, failures=1, next_attempt=30.0)},
            set(),
            [],
            [],
            [],
            20.0,
            id="failing: waits for its next attempt (at 30, now 10)",
        ),
        pytest.param(
            {},
            set(),
            [0.0, 1.0],
            [],
            [],
            10_800.0 - 10.0,
            id="at the pace: nothing starts, the pass waits for the oldest to age out",
        ),
        pytest.param(
            {"old.test": record(issued=issued()), "gone.test": record(CertState.ORDERING)},
            {"gone.test"},
            [],
            ["old.test"],
            [("shop.test", "shop")],
            60.0,
            id="routed by no app: dropped, unless being ordered",
        ),
    ],
)
def test_a_pass(
    records: dict[str, CertRecord],
    ordering: set[str],
    started: list[float],
    drop: list[str],
    start: list[tuple[str, str]],
    wait: float,
) -> None:
    plan = rules.plan_pass(
        {"shop.test": "shop"},
        records,
        ordering,
        started,
        10.0,
        directory=PRODUCTION,
        limit=2,
        ceiling=60.0,
    )
    assert (plan.drop, plan.start, plan.wait) == (drop, start, wait)
