"""gRPC as the ingress sees it, pure: which requests are calls, their deadline, how the
ingress's own errors read to a gRPC client, and the status each call ended with.

A call is an HTTP/2 request whose content type is `application/grpc` (or `+proto`, `+json`,
...). The ingress does not parse messages: it passes the stream through (to an app with
`protocol = "h2c"`), and speaks gRPC only where it answers itself: an error before the call
reached a sandbox is a trailers-only answer (HTTP 200, `grpc-status`, `grpc-message`) with the
code the gRPC spec maps the HTTP status to, and the text the HTTP answer would carry.

A call's outcome is its `grpc-status`, not its HTTP status (200 for nearly every call): the
metrics and the access log count it by `call_code`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote

from wakeful.domain.grpcstatus import MAX_CODE

OK = 0
CANCELLED = 1
UNKNOWN = 2
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
UNAUTHENTICATED = 16

_BY_HTTP = {
    400: INTERNAL,
    401: UNAUTHENTICATED,
    403: PERMISSION_DENIED,
    404: UNIMPLEMENTED,
    408: DEADLINE_EXCEEDED,
    429: UNAVAILABLE,
    431: RESOURCE_EXHAUSTED,
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    504: DEADLINE_EXCEEDED,
    499: CANCELLED,
}
"""The gRPC spec's table (doc/http-grpc-status-mapping.md), with the ingress's own 408, 431
and 504 given the codes that say what happened, and 499 (a client that left, never sent) the
code its call ended with."""

_STATUS_DIGITS = len(str(MAX_CODE))
_TIMEOUT = re.compile(rb"^([0-9]{1,8})([HMSmun])$")
_UNIT = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def is_call(content_type: bytes | None) -> bool:
    return content_type is not None and (
        content_type == b"application/grpc"
        or content_type.startswith((b"application/grpc+", b"application/grpc;"))
    )


def parse_timeout(value: bytes | None) -> float | None:
    """Seconds a `grpc-timeout` value gives (`100m`, `5S`); None when absent or malformed
    (a malformed one is the sandbox's to refuse)."""
    if value is None:
        return None
    found = _TIMEOUT.match(value.strip())
    if found is None:
        return None
    return int(found.group(1)) * _UNIT[found.group(2)]


def timeout_value(seconds: float) -> bytes:
    """`seconds` as a `grpc-timeout` value, in milliseconds (at least 1)."""
    return b"%dm" % max(1, min(99_999_999, int(seconds * 1000)))


def code_for(http_status: int) -> int:
    return _BY_HTTP.get(http_status, UNKNOWN)


def error_head(code: int, message: str) -> list[tuple[bytes, bytes]]:
    """A trailers-only answer's fields (after `:status 200`)."""
    return [
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"%d" % code),
        (b"grpc-message", quote(message, safe=" !#$&'()*+,/:;=?@[]~").encode("ascii")),
    ]


def status_of(
    head: Sequence[tuple[bytes, bytes]], trailers: Sequence[tuple[bytes, bytes]]
) -> int | None:
    """The `grpc-status` of an answer, from its last field block (as a client reads it): its
    trailers, or its head when it has none (a trailers-only answer). None when that block has
    none, or a malformed one: anything but one or two ASCII digits (`MAX_CODE`). A code gRPC
    does not name (17..99) is kept as given."""
    for name, value in trailers or head:
        if name == b"grpc-status":
            value = value.strip()
            if 0 < len(value) <= _STATUS_DIGITS and value.isdigit():
                return int(value)
            return None
    return None


def call_code(
    http_status: int,
    head: Sequence[tuple[bytes, bytes]] = (),
    trailers: Sequence[tuple[bytes, bytes]] = (),
) -> int:
    """The code a call ended with, as it is counted: CANCELLED for a client that left (499),
    else its answer's `grpc-status` (`status_of`), else the code for its HTTP status
    (`code_for`): the code of an error the ingress answered itself, UNAVAILABLE for an answer
    cut off (502), and for a sandbox's answer without a readable status, what gRPC's spec has
    its client read (UNKNOWN for a 200)."""
    if http_status != 499:
        code = status_of(head, trailers)
        if code is not None:
            return code
    return code_for(http_status)
