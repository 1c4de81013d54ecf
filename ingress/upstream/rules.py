"""How a sandbox's answer head is read: which status is the answer, where its body ends, how
much framing it may send. Written once, for pooled exchanges and WebSocket handshakes alike.

The rule that keeps this correct: **an answer is passed on only when the ingress knows where
it ends**, because whatever follows it on the connection would otherwise be taken for the
next request's answer. So an answer is one final status (1xx heads before it are interim),
within 200-599 (or a 101 to a handshake that asked for it); an interim head frames no body and
an answer's only transfer coding is chunked; a body with neither Content-Length
nor Transfer-Encoding ends only with the connection; and the bytes that are not body (status
line, headers, chunk sizes, trailers) are bounded, since the parser buffers a header line
whole.

No asyncio, no I/O, no clock: the protocols in `upstream.connection` and `upstream.handshake`
feed what httptools parsed and act on what these return.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Final

import httptools

from wakeful.ingress.errors import UpstreamFailed

MAX_FRAMING_BYTES: Final = 64 * 1024
"""Bytes of an answer that are not body (status line, headers, chunk sizes, trailers) in a row:
past it the answer is refused. httptools buffers a header line whole, so without this a
sandbox sending one endless header could fill the ingress's memory."""


class Head(IntEnum):
    """What a parsed answer head is."""

    INFORMATIONAL = 1
    """A 1xx (100 Continue, 103 Early Hints, ...): an interim answer; the answer follows."""
    FINAL = 2
    """The answer."""
    SWITCH = 3
    """A 101 to a handshake: the answer, and the connection then carries the tunnel."""


INFORMATIONAL: Final = Head.INFORMATIONAL
FINAL: Final = Head.FINAL
SWITCH: Final = Head.SWITCH
_FRAMED: Final = frozenset({b"content-length", b"transfer-encoding"})


def judge_status(status: int, handshake: bool) -> Head:
    """What an answer head with `status` is, to a WebSocket handshake (`handshake`) or to a
    plain request; UpstreamFailed when no answer may have it."""
    if 200 <= status <= 599:
        return FINAL
    if status == 101:
        if handshake:
            return SWITCH
        raise UpstreamFailed("the sandbox switched protocols unasked")
    if 100 <= status < 200:
        return INFORMATIONAL
    raise UpstreamFailed(f"the sandbox answered with status {status}")


def framed_by_close(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """The answer's body ends only when the connection does: its head has neither a
    Content-Length nor a Transfer-Encoding (names in any case)."""
    return not any(name.lower() in _FRAMED for name, _ in headers)


def framing_run(run: int, read: int, body_came: bool) -> int:
    """Framing bytes read in a row after a read of `read` bytes, `run` before it: a read that
    brought any body starts the count again. Past `MAX_FRAMING_BYTES` the answer is refused."""
    return 0 if body_came else run + read


def framing_refused(headers: Iterable[tuple[bytes, bytes]], interim: bool) -> str | None:
    """Why an answer head's framing cannot be passed on, or None. A 1xx has no body (RFC 9110
    §15.2), so an interim head that frames one (a Transfer-Encoding, a Content-Length but
    0) is refused: llhttp would read one, and it would go out as the answer's body. An answer
    coded other than `chunked` (`gzip, chunked`, `gzip`) is refused as nginx refuses it: the
    coding is hop-by-hop and would go out undone, unnamed (or, alone, end with the
    connection)."""
    for name, value in headers:
        lower = name.lower()
        if lower == b"transfer-encoding":
            if interim:
                return "the sandbox's interim (1xx) answer frames a body"
            if value.strip().lower() != b"chunked":
                return f"the sandbox's answer is coded {value[:40]!r}, not chunked"
        elif lower == b"content-length" and interim and value.strip() != b"0":
            return "the sandbox's interim (1xx) answer frames a body"
    return None


def callback_error(exc: BaseException) -> BaseException | None:
    """What one of our parser callbacks raised, when `exc` (an httptools parser error) is
    httptools' report of it (it puts the callback's exception in `__context__`); else None.
    Any other parser error's `__context__` is whatever exception was being handled when it
    was raised, which need not be ours: compiled, a ClosedUnanswered an earlier exchange
    caught was still there, and a WebSocket handshake's 101 without Upgrade was answered
    with its text (and a pooled exchange's bad answer could have been resent as if closed
    unanswered)."""
    if isinstance(exc, httptools.HttpParserCallbackError):
        return exc.__context__
    return None
