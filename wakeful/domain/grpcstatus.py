"""gRPC's status codes as people read them, for the ingress's metrics and the access log.

A code is a small non-negative integer (`grpc-status: 14`); gRPC names 0..16 (its
doc/statuscodes.md). The ingress reads at most `MAX_CODE` (two digits): a sandbox that sends a
code past the named ones keeps it as it sent it, read and shown as its number, and no sandbox
can make more than `MAX_CODE + 1` series of an app's calls.
"""

from __future__ import annotations

NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
"""Each code's canonical name, at its number."""
MAX_CODE = 99
"""The largest code read from an answer; a longer value is malformed."""


def code_name(code: int) -> str:
    """`UNAVAILABLE` of 14; a code gRPC does not name, as its number (`42`)."""
    return NAMES[code] if 0 <= code < len(NAMES) else str(code)
