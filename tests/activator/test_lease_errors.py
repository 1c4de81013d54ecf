"""The lease API's error table (`activator/lease_errors.py`): each error's wire form on the
channel and over HTTP, what a client reads back from it, and the generic error for a code or
status the table does not know."""

from __future__ import annotations

from typing import Any

import pytest

from wakeful.activator.lease_errors import (
    CODES,
    DEFAULT_RETRY_AFTER,
    from_channel,
    from_http,
    from_wire,
    to_wire,
)
from wakeful.domain.leases import (
    ActivatorError,
    AppFailedToBoot,
    LeaseGone,
    NoCapacity,
    Overloaded,
    Unauthorized,
    UnknownApp,
    Unreachable,
)
from wakeful.store import Conflict, StoreError, Unavailable


def facts(exc: ActivatorError) -> tuple[type[ActivatorError], str, int | None, str | None]:
    """What a caller can tell of an error: its type, message, retry_after and boot log."""
    return type(exc), str(exc), getattr(exc, "retry_after", None), getattr(exc, "log", None)


# (raised by the activator, what a client reads back: None for the same error; a plain
# ActivatorError reads back as the generic one, which names the code and the detail)
ROUND_TRIPS = [
    pytest.param(UnknownApp("no app named 'x'"), None, id="UnknownApp survives"),
    pytest.param(LeaseGone("lease 'L' expired"), None, id="LeaseGone survives"),
    pytest.param(NoCapacity("none ready in 120 s", 7), None, id="NoCapacity keeps retry_after"),
    pytest.param(
        AppFailedToBoot("app 'x' failed to boot", 30, "Traceback...\nValueError: boom"),
        None,
        id="AppFailedToBoot keeps retry_after and its boot log",
    ),
    pytest.param(
        AppFailedToBoot("failed", 3, ""), None, id="AppFailedToBoot with an empty log keeps it"
    ),
    pytest.param(Unauthorized("refused"), None, id="Unauthorized survives"),
    pytest.param(
        Overloaded("app 'x' has 100 requests waiting already", 5),
        NoCapacity("app 'x' has 100 requests waiting already", 5),
        id="Overloaded reads as NoCapacity: one code on the wire for both",
    ),
    pytest.param(
        Unreachable("this activator stopped leading", 1),
        NoCapacity("this activator stopped leading", 1),
        id="Unreachable reads as NoCapacity, retry_after kept",
    ),
    pytest.param(
        Unavailable("etcd: no answer in time"),
        NoCapacity("etcd: no answer in time", 1),
        id="a store that does not answer reads as NoCapacity, retry after 1 s",
    ),
    pytest.param(
        Conflict("pools/hello-v1", 9, 8),
        NoCapacity("'pools/hello-v1' is at revision 9, expected revision 8", 1),
        id="any StoreError on the lease API is store unavailable",
    ),
    pytest.param(
        ActivatorError("more than 100000 leases reported on a channel"),
        None,
        id="any other ActivatorError reads as the generic one naming code and detail",
    ),
]


@pytest.mark.parametrize(("raised", "read"), ROUND_TRIPS)
def test_every_error_survives_the_lease_channel(
    raised: ActivatorError | StoreError, read: ActivatorError | None
) -> None:
    answer = {"id": 7, **to_wire(raised).fields()}
    expected = read if read is not None else raised
    assert isinstance(expected, ActivatorError)
    if type(expected) is ActivatorError:  # the channel's generic message
        expected = ActivatorError(f"activator answered: activator error {raised}")
    assert facts(from_channel(answer)) == facts(expected)


@pytest.mark.parametrize(("raised", "read"), ROUND_TRIPS)
def test_every_error_survives_http(
    raised: ActivatorError | StoreError, read: ActivatorError | None
) -> None:
    wire = to_wire(raised)
    header = wire.headers().get("Retry-After")
    expected = read if read is not None else raised
    assert isinstance(expected, ActivatorError)
    if type(expected) is ActivatorError:  # HTTP's generic message names the status too
        expected = ActivatorError(f"activator answered 500: activator error {raised}")
    assert facts(from_http(wire.status, wire.body(), "", header)) == facts(expected)


@pytest.mark.parametrize(
    ("raised", "fields", "status", "body", "headers"),
    [
        pytest.param(
            UnknownApp("no app named 'x'"),
            {"error": "unknown app", "detail": "no app named 'x'"},
            404,
            {"error": "unknown app", "detail": "no app named 'x'"},
            {},
            id="unknown app is 404",
        ),
        pytest.param(
            LeaseGone("gone"),
            {"error": "lease gone", "detail": "gone"},
            404,
            {"error": "lease gone", "detail": "gone"},
            {},
            id="lease gone is 404",
        ),
        pytest.param(
            AppFailedToBoot("crashed", 29.6, "log"),
            {"error": "app failed to boot", "detail": "crashed", "retry_after": 30, "log": "log"},
            503,
            {"error": "app failed to boot", "detail": "crashed", "log": "log"},
            {"Retry-After": "30"},
            id="a failed boot is 503 with its log, retry_after a field or the header",
        ),
        pytest.param(
            Overloaded("full", 5),
            {"error": "no capacity", "detail": "full", "retry_after": 5},
            503,
            {"error": "no capacity", "detail": "full"},
            {"Retry-After": "5"},
            id="every other Unavailable is no capacity",
        ),
        pytest.param(
            Unavailable("sqlite: locked"),
            {"error": "store unavailable", "detail": "sqlite: locked", "retry_after": 1},
            503,
            {"error": "store unavailable", "detail": "sqlite: locked"},
            {"Retry-After": "1"},
            id="a store error is store unavailable, retry after 1 s",
        ),
        pytest.param(
            ActivatorError("id in use"),
            {"error": "activator error", "detail": "id in use"},
            500,
            {"error": "activator error", "detail": "id in use"},
            {},
            id="any other activator error is 500",
        ),
    ],
)
def test_what_goes_over_the_wire(
    raised: ActivatorError | StoreError,
    fields: dict[str, Any],
    status: int,
    body: dict[str, Any],
    headers: dict[str, str],
) -> None:
    wire = to_wire(raised)
    assert wire.fields() == fields
    assert list(wire.fields()) == list(fields)  # in this order, as before the table
    assert (wire.status, wire.body(), wire.headers()) == (status, body, headers)


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        pytest.param(
            "overheated",
            None,
            "activator answered: overheated the detail",
            id="an unknown code on the channel is the generic error naming it",
        ),
        pytest.param(
            "overheated",
            418,
            "activator answered 418: overheated the detail",
            id="an unknown code and status over HTTP name both",
        ),
        pytest.param(
            "no capacity",
            500,
            "activator answered 500: no capacity the detail",
            id="a known code under a status not its own and with no reading of its own",
        ),
        pytest.param(
            "invalid request",
            None,
            "activator answered: invalid request the detail",
            id="an invalid request reads as the generic error",
        ),
        pytest.param(
            "cancelled",
            None,
            "activator answered: cancelled the detail",
            id="a cancelled acquire reads as the generic error",
        ),
    ],
)
def test_an_unknown_wire_code_is_a_clear_generic_error(
    code: str, status: int | None, expected: str
) -> None:
    read = from_wire(code, "the detail", status=status)
    assert type(read) is ActivatorError
    assert str(read) == expected


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        pytest.param(404, "", UnknownApp, id="a 404 without a code is UnknownApp"),
        pytest.param(404, "app failed to boot", UnknownApp, id="a 404's status wins"),
        pytest.param(503, "", NoCapacity, id="a 503 without a code is NoCapacity"),
        pytest.param(503, "lease gone", NoCapacity, id="a 503's status wins over lease gone"),
        pytest.param(401, "", Unauthorized, id="a 401 is Unauthorized"),
        pytest.param(403, "forbidden", Unauthorized, id="a 403 is Unauthorized"),
    ],
)
def test_over_http_the_status_decides_when_the_code_is_not_its_own(
    status: int, code: str, kind: type[ActivatorError]
) -> None:
    assert type(from_wire(code, "the detail", status=status)) is kind


def test_an_http_answer_that_is_not_json_is_read_by_its_status() -> None:
    read = from_http(503, None, "<html>bad gateway</html>", None)
    assert facts(read) == facts(NoCapacity("<html>bad gateway</html>", DEFAULT_RETRY_AFTER))
    refused = from_http(401, None, "", None)
    assert facts(refused) == facts(Unauthorized("the activator refused the token"))


def test_a_channel_answer_without_retry_after_waits_the_default() -> None:
    read = from_channel({"id": 1, "error": "no capacity", "detail": "slow"})
    assert facts(read) == facts(NoCapacity("slow", DEFAULT_RETRY_AFTER))


def test_every_code_has_one_status_and_reads_back_through_it() -> None:
    for code, row in CODES.items():
        read = from_wire(code, "d", status=row.status)
        if row.reads_as is None:
            assert type(read) is ActivatorError
        else:
            assert isinstance(read, row.reads_as)
