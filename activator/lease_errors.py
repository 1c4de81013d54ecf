"""The lease API's errors on the wire: one table for the lease channel and the HTTP API.

Every error the lease API answers with has a code (the answer's `error` field, the same on
both transports) and an HTTP status. The activator turns an error into its wire form with
`to_wire`; the clients turn a wire form back with `from_wire` (`from_channel` and `from_http`
read their transport's answer first). Nothing else maps a code, so the two transports and
their two sides cannot drift apart.

    code                 status  raised as                         read back as
    unknown app          404     UnknownApp                        UnknownApp
    lease gone           404     LeaseGone                         LeaseGone
    app failed to boot   503     AppFailedToBoot (+ retry, log)    AppFailedToBoot
    no capacity          503     any other Unavailable (+ retry)   NoCapacity
    store unavailable    503     a StoreError (retry 1)            NoCapacity
    unauthorized         401     Unauthorized                      Unauthorized
    forbidden            403     (the control API's role check)    Unauthorized
    invalid request      422     (not the protocol)                the generic ActivatorError
    cancelled            499     (a cancelled acquire, channel)    the generic ActivatorError
    activator error      500     any other ActivatorError          the generic ActivatorError

Rules:
- `retry_after` goes as a field on the channel and as `Retry-After` over HTTP; a boot log as
  the field `log` on both. A client that finds no retry_after assumes `DEFAULT_RETRY_AFTER`.
- The wire has one code for every `Unavailable` but a failed boot: `Overloaded` and
  `Unreachable` read back as `NoCapacity`, with their message and `retry_after`.
- Over HTTP the status decides when the code does not belong to it (a proxy's answer in
  between, a route FastAPI refused itself): 401 and 403 read as `Unauthorized`, 404 as
  `UnknownApp`, 503 as `NoCapacity`. Any other code or status reads as the generic
  `ActivatorError`, which names both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wakeful.domain.leases import (
    ActivatorError,
    AppFailedToBoot,
    LeaseGone,
    NoCapacity,
    Unauthorized,
    Unavailable,
    UnknownApp,
)
from wakeful.store import StoreError

UNKNOWN_APP = "unknown app"
LEASE_GONE = "lease gone"
APP_FAILED_TO_BOOT = "app failed to boot"
NO_CAPACITY = "no capacity"
STORE_UNAVAILABLE = "store unavailable"
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
INVALID_REQUEST = "invalid request"
CANCELLED = "cancelled"
ACTIVATOR_ERROR = "activator error"

DEFAULT_RETRY_AFTER = 5.0
"""Seconds a client waits when an Unavailable answer names none."""


@dataclass(frozen=True, slots=True)
class Code:
    code: str
    status: int
    reads_as: type[ActivatorError] | None
    """None: read back as the generic `ActivatorError`."""


CODES: dict[str, Code] = {
    code.code: code
    for code in (
        Code(UNKNOWN_APP, 404, UnknownApp),
        Code(LEASE_GONE, 404, LeaseGone),
        Code(APP_FAILED_TO_BOOT, 503, AppFailedToBoot),
        Code(NO_CAPACITY, 503, NoCapacity),
        Code(STORE_UNAVAILABLE, 503, NoCapacity),
        Code(UNAUTHORIZED, 401, Unauthorized),
        Code(FORBIDDEN, 403, Unauthorized),
        Code(INVALID_REQUEST, 422, None),
        Code(CANCELLED, 499, None),
        Code(ACTIVATOR_ERROR, 500, None),
    )
}

BY_STATUS: dict[int, Code] = {
    401: CODES[UNAUTHORIZED],
    403: CODES[FORBIDDEN],
    404: CODES[UNKNOWN_APP],
    503: CODES[NO_CAPACITY],
}
"""What an HTTP answer reads as when its code is not one of its status's."""


@dataclass(frozen=True, slots=True)
class WireError:
    """One error as the lease API sends it."""

    code: str
    detail: str
    retry_after: int | None = None
    log: str | None = None

    @property
    def status(self) -> int:
        return CODES[self.code].status

    def fields(self) -> dict[str, Any]:
        """The error fields of a lease channel answer."""
        found: dict[str, Any] = {"error": self.code, "detail": self.detail}
        if self.retry_after is not None:
            found["retry_after"] = self.retry_after
        if self.log is not None:
            found["log"] = self.log
        return found

    def body(self) -> dict[str, Any]:
        """The JSON body of an HTTP answer (`retry_after` goes in `headers`)."""
        found: dict[str, Any] = {"error": self.code, "detail": self.detail}
        if self.log is not None:
            found["log"] = self.log
        return found

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


def to_wire(exc: ActivatorError | StoreError) -> WireError:
    """The wire form of an error the activator raised, the most specific type first."""
    detail = str(exc)
    if isinstance(exc, StoreError):
        return WireError(STORE_UNAVAILABLE, detail, retry_after=1)
    if isinstance(exc, UnknownApp):
        return WireError(UNKNOWN_APP, detail)
    if isinstance(exc, LeaseGone):
        return WireError(LEASE_GONE, detail)
    if isinstance(exc, AppFailedToBoot):
        return WireError(APP_FAILED_TO_BOOT, detail, retry_after=exc.retry_after, log=exc.log)
    if isinstance(exc, Unavailable):
        return WireError(NO_CAPACITY, detail, retry_after=exc.retry_after)
    if isinstance(exc, Unauthorized):
        return WireError(UNAUTHORIZED, detail)
    return WireError(ACTIVATOR_ERROR, detail)


def from_wire(
    code: str,
    detail: str,
    *,
    retry_after: float = DEFAULT_RETRY_AFTER,
    log: str = "",
    status: int | None = None,
) -> ActivatorError:
    """The error a client raises for an error answer; `status` only over HTTP."""
    found = CODES.get(code)
    if status is not None and (found is None or found.status != status):
        found = BY_STATUS.get(status)
    kind = None if found is None else found.reads_as
    if kind is None:
        answered = "activator answered" if status is None else f"activator answered {status}"
        return ActivatorError(f"{answered}: {code} {detail}")
    if kind is AppFailedToBoot:
        return AppFailedToBoot(detail, retry_after, log)
    if issubclass(kind, Unavailable):
        return kind(detail, retry_after)
    if kind is Unauthorized:
        return Unauthorized(detail or "the activator refused the token")
    return kind(detail)


def from_channel(answer: Mapping[str, Any]) -> ActivatorError:
    """The error a lease channel answer with an `error` field stands for."""
    return from_wire(
        str(answer.get("error", "")),
        str(answer.get("detail", "")),
        retry_after=float(answer.get("retry_after", DEFAULT_RETRY_AFTER) or DEFAULT_RETRY_AFTER),
        log=str(answer.get("log", "")),
    )


def from_http(status: int, body: object, text: str, retry_after: str | None) -> ActivatorError:
    """The error an HTTP answer that is not a success stands for: `body` is its parsed JSON
    (None when it is not JSON), `text` the body as text, `retry_after` its header."""
    if isinstance(body, dict):
        code, detail, log = (str(body.get(key, "")) for key in ("error", "detail", "log"))
    else:
        code, detail, log = "", text[:200], ""
    return from_wire(
        code,
        detail,
        retry_after=float(retry_after or DEFAULT_RETRY_AFTER),
        log=log,
        status=status,
    )
