"""How a request head frames its message, or why it is refused: bytes in, a decision out.

The rule that keeps this correct: **a request is forwarded only when there is exactly one
way to read where it ends.** A body is framed by one `Transfer-Encoding: chunked` or by one
`Content-Length` of digits, never by both, never by a coding the ingress does not decode
(`gzip, chunked` would leave the sandbox to guess); anything else is refused with 400 before
it reaches a sandbox, since a sandbox that reads the framing differently would take the rest
of the bytes for another request (request smuggling).

This module is the whole of that decision: no asyncio, no I/O, no clock. The HTTP/1.1
server's parser (httptools, llhttp in its strict mode) hands over a head it could parse (names
lower-cased, values with their surrounding whitespace cut) and the server acts on what
`frame_request` returns (`http1.connection`). The parser already refuses what cannot be a head
at all (obs-fold, a bare LF, whitespace before a colon, a control character in a value, two
Content-Lengths, Content-Length with Transfer-Encoding, `chunked` not last); the rules below
refuse every framing shape among those by themselves too, so a laxer parser opens no path.

`frame_request` runs for every request: a head without framing headers or an upgrade costs
one pass over its names and returns a constant.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, NamedTuple

from wakeful.ingress.errors import BadRequest

_FRAMING: Final = frozenset({b"transfer-encoding", b"content-length", b"expect"})
"""The request headers the server itself reads."""
_OWS: Final = b" \t"
"""Optional whitespace around a field value (RFC 9110 §5.6.3): not CR or LF, so an obs-fold
left in a value is never read as part of the framing."""


class RequestFrame(NamedTuple):
    """How the server reads the rest of a request and what it owes the client."""

    body: bool
    """A body follows the head (chunked, or a Content-Length other than 0)."""
    expect_continue: bool
    """Send `100 Continue` when the body is first read (HTTP/1.1 only: RFC 9110 §10.1.1)."""
    upgrade: bool
    """A WebSocket handshake: after it the connection carries the splice, not HTTP."""
    keep_alive: bool
    """Another request may follow on the connection."""


PLAIN: Final = RequestFrame(body=False, expect_continue=False, upgrade=False, keep_alive=True)
PLAIN_LAST: Final = RequestFrame(body=False, expect_continue=False, upgrade=False, keep_alive=False)


def frame_request(
    method: str,
    version: str,
    headers: list[tuple[bytes, bytes]],
    parser_upgrade: bool,
    parser_keep_alive: bool,
) -> RequestFrame:
    """The framing of a request whose head is `headers`, or BadRequest naming why none is safe.

    `parser_upgrade`: the parser saw `Connection: upgrade` with an `Upgrade` header (or a
    CONNECT), so it stops at the head's end and hands what follows over as another protocol.
    `parser_keep_alive`: the parser's reading of the version and `Connection`.
    """
    chunked = False
    length: bytes | None = None
    expect = False
    for name, value in headers:
        if name not in _FRAMING:
            continue
        if name == b"transfer-encoding":
            if chunked:
                raise BadRequest("two Transfer-Encoding headers")
            if value.strip(_OWS).lower() != b"chunked":  # no other coding is understood
                raise BadRequest("unsupported transfer-encoding")
            chunked = True
        elif name == b"content-length":
            if length is not None:
                raise BadRequest("two Content-Length headers")
            length = value.strip(_OWS)
            if not length.isdigit():
                raise BadRequest("Content-Length is not a number")
        elif value.lower() == b"100-continue":  # expect
            expect = version == "1.1"  # HTTP/1.0 has no expectations (RFC 9110 10.1.1)
    if chunked and length is not None:
        raise BadRequest("Content-Length with Transfer-Encoding")
    body = chunked or (length is not None and length != b"0")
    if parser_upgrade and body:
        # The parser hands every byte after an upgrade's head over as the new protocol: the
        # body announced would never be read, and the sandbox, told of it, would take the
        # next request on its pooled connection for the rest of this one.
        raise BadRequest("an upgrade request with a body")
    upgrade = (
        parser_upgrade
        and version == "1.1"  # RFC 6455; and no 1xx may go to an HTTP/1.0 client
        and not body
        and is_websocket(method, headers)
    )
    if not (body or upgrade):
        return PLAIN if parser_keep_alive else PLAIN_LAST
    return RequestFrame(body, expect and body, upgrade, parser_keep_alive and not upgrade)


def known_version(keep_alive: bool, connection_header: bool) -> str | None:
    """A request's HTTP version when its head alone tells it, else None (ask the parser).
    llhttp takes versions 0.9, 1.0, 1.1 and 2.0 only, and keeps a connection open with no
    Connection header (nor Proxy-Connection, which it reads as one) for 1.1 alone: such a
    head (most) is 1.1. The parser's own answer is a string formatted anew at every call, as
    costly as the rest of the head's callback."""
    return "1.1" if keep_alive and not connection_header else None


def is_websocket(method: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """A WebSocket opening handshake (RFC 6455 §4.1): GET, `Upgrade: websocket`, and
    `Connection` naming `upgrade`."""
    if method != "GET":
        return False
    upgrade = connection = False
    for name, value in headers:
        if name == b"upgrade":
            upgrade = upgrade or any(
                token.strip().lower() == b"websocket" for token in value.split(b",")
            )
        elif name == b"connection":
            connection = connection or any(
                token.strip().lower() == b"upgrade" for token in value.split(b",")
            )
    return upgrade and connection


HEAD_DUE: Final = 1
"""`passed`: the head's deadline (its head, or the next, was not complete in time)."""
IDLE_DUE: Final = 2
"""`passed`: the keep-alive deadline (no request begun in time)."""
NOT_DUE: Final = 0
"""`passed`: neither; the deadlines moved later since the timer was armed."""


def passed(head_due: float | None, idle_due: float | None, now: float) -> tuple[int, float | None]:
    """Which of a connection's deadlines (None: unset) has passed at `now`, the head's first;
    with `NOT_DUE`, when the timer is next due (None: no deadline is set)."""
    if head_due is not None and now >= head_due:
        return HEAD_DUE, None
    if idle_due is not None and now >= idle_due:
        return IDLE_DUE, None
    if head_due is None or idle_due is None:
        return NOT_DUE, idle_due if head_due is None else head_due
    return NOT_DUE, min(head_due, idle_due)


_ABSOLUTE: Final = re.compile(rb"[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)")
"""An absolute-form request target's scheme and authority (RFC 9112 §3.2.2)."""


def origin_form(
    url: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A request target in absolute-form (`http://host/path?q`, what a client sends a proxy)
    as origin-form (`/path?q`), with the host it names as the one Host header: RFC 9112
    §3.2.2 has a server accept the form and take the host from it, not from Host. Any other
    target comes back as it is, and the edge refuses it as no path before it routes (or
    redirects) it: `*`, authority-form, another scheme, no host, or a user in it (RFC 9110
    §4.2.4 forbids one)."""
    absolute = _ABSOLUTE.match(url)
    authority = b"" if absolute is None else absolute.group(1)
    if absolute is None or not authority or b"@" in authority:
        return url, headers
    rest = url[absolute.end() :]
    path = rest if rest[:1] == b"/" else b"/" + rest
    return path, [(b"host", authority), *(pair for pair in headers if pair[0] != b"host")]
