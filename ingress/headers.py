"""Header rules for both directions, as pure functions of the headers and a few facts.

Headers are kept as the wire has them, `bytes` pairs with lower-case names (the HTTP/1.1
server lower-cases request names; response names are lower-cased here), so nothing is decoded
and encoded again on the way through. These run once or twice per proxied request: each reads
the headers in one pass, and the sets they test against are built once, here, not per call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Final

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""RFC 9110 §7.6.1 plus the legacy Proxy-Connection: meaningful for one hop only."""

FORWARDED: Final = frozenset(
    {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"forwarded"}
)
REQUEST_ID: Final = b"x-request-id"
_SANE_ID: Final = re.compile(rb"^[A-Za-z0-9._:@/+=-]{1,200}$")

_UPSTREAM_DROP: Final = HOP_BY_HOP | FORWARDED | {REQUEST_ID, b"expect"}
"""Never forwarded as received: X-Forwarded-* and X-Request-Id are set anew; the ingress
answers `Expect: 100-continue` itself (the server sends 100 when the body is first read)."""
_RESPONSE_DROP: Final = HOP_BY_HOP | {REQUEST_ID}
_NOTABLE: Final = frozenset({b"host", REQUEST_ID})
_HOST: Final = frozenset({b"host"})

Headers = list[tuple[bytes, bytes]]


class RequestHead:
    """What the edge needs of the request headers, read in one pass. A plain class: compiled,
    it is made without a call through the interpreter (a NamedTuple's `__new__` is one)."""

    __slots__ = ("client_request_id", "host", "hosts", "size")

    def __init__(self, host: str, client_request_id: str | None, size: int, hosts: int) -> None:
        self.host = host
        """The first Host header, latin-1 ("" when none)."""
        self.client_request_id = client_request_id
        """The first sane X-Request-Id the client sent."""
        self.size = size
        """The size the headers took on the wire (name, value, ": " and CRLF), near enough
        for a bound on the request head."""
        self.hosts = hosts
        """How many Host headers came: more than one is refused (RFC 9112 §3.2), or the
        route would follow one and the sandbox might read the other."""


def read_request_head(raw: list[tuple[bytes, bytes]]) -> RequestHead:
    """Pick out what routing, ids and the head's bound need, in one pass."""
    host: bytes | None = None
    hosts = 0
    request_id: str | None = None
    size = 0
    for name, value in raw:
        size += len(name) + len(value) + 4
        if name in _NOTABLE:
            if name == b"host":
                hosts += 1
                if host is None:
                    host = value
            elif request_id is None and _SANE_ID.match(value):
                request_id = value.decode("ascii")
    return RequestHead(host.decode("latin-1") if host else "", request_id, size, hosts)


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of `name` (lower case), or None."""
    for each, value in headers:
        if each == name:
            return value
    return None


def last_header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The last value of `name` (lower case), or None: of a header a proxy appends to (the
    X-Forwarded-* chain), the field the nearest one wrote, as `upstream_request_headers`
    reads it."""
    found = None
    for each, value in headers:
        if each == name:
            found = value
    return found


class _RequestIds:
    """32 random hex digits (as many as a UUID's) per id, from the OS's CSPRNG, read 4 KiB at
    a time and turned to hex at once: one `getrandom` call per 256 requests instead of one
    per request, and each id a slice of a string already made."""

    def __init__(self) -> None:
        self._pool = ""
        self._at = 0

    def next(self) -> str:
        if self._at >= len(self._pool):
            self._pool, self._at = os.urandom(4096).hex(), 0
        at = self._at
        self._at = at + 32
        return self._pool[at : at + 32]


_REQUEST_IDS: Final = _RequestIds()


def new_request_id() -> str:
    """A new request id (`_RequestIds`). A function, not the instance called: compiled, a
    call of an instance goes through the interpreter."""
    return _REQUEST_IDS.next()


def connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Every header the Connection header(s) name: they are hop-by-hop for this message."""
    named: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            named.update(token.strip().lower() for token in value.split(b","))
    named.discard(b"")
    return frozenset(named)


def upstream_request_headers(
    headers: list[tuple[bytes, bytes]],
    *,
    client_ip: str,
    scheme: str,
    request_id: str,
    trust_forwarded: bool,
) -> Headers:
    """What the sandbox sees: hop-by-hop gone, X-Forwarded-* set, X-Request-Id present.

    An incoming forwarding chain is kept (and appended to) only when the peer is trusted;
    otherwise a client could claim any address.
    """
    drop = _UPSTREAM_DROP
    out: Headers = []
    host = b""
    forwarded: dict[bytes, bytes] = {}
    for pair in headers:
        name = pair[0]
        if name == b"host" and not host:  # even when Connection names it: still the host
            host = pair[1]
        if name in drop:
            if name in FORWARDED:
                forwarded[name] = pair[1]  # the last, as a dict of them would keep
            elif name == b"connection":  # the host stays, named or not: the sandbox's
                drop = drop | (connection_named(headers) - _HOST)  # app is served by it
                out = [each for each in out if each[0] not in drop]
            continue
        out.append(pair)
    ip = client_ip.encode("latin-1")
    if trust_forwarded:
        chain = forwarded.get(b"x-forwarded-for")
        out.append((b"x-forwarded-for", chain + b", " + ip if chain else ip))
        proto = forwarded.get(b"x-forwarded-proto") or scheme.encode()
        out.append((b"x-forwarded-proto", proto))
        out.append((b"x-forwarded-host", forwarded.get(b"x-forwarded-host") or host))
        if b"forwarded" in forwarded:
            out.append((b"forwarded", forwarded[b"forwarded"]))
    else:
        out.append((b"x-forwarded-for", ip))
        out.append((b"x-forwarded-proto", scheme.encode()))
        out.append((b"x-forwarded-host", host))
    out.append((REQUEST_ID, request_id.encode("latin-1")))
    return out


def client_response_headers(raw: Sequence[tuple[bytes, bytes]], request_id: str) -> Headers:
    """What the client sees: hop-by-hop gone, our X-Request-Id echoed (the sandbox's dropped)."""
    out: Headers = []
    connection = False
    for name, value in raw:
        name = name.lower()
        if name in _RESPONSE_DROP:
            connection = connection or name == b"connection"
            continue
        out.append((name, value))
    if connection:  # rare: what the Connection header names goes too, wherever it came
        named = connection_named((name.lower(), value) for name, value in raw)
        out = [pair for pair in out if pair[0] not in named]
    out.append((REQUEST_ID, request_id.encode("latin-1")))
    return out


def server_timing(queued: float, woke: float, upstream: float, woke_by: str = "") -> bytes:
    """The `Server-Timing` value of a proxied answer, in milliseconds: `queue` (waiting for a
    lease), `wake` (of which waiting for the app to wake; only when this request woke it; its
    `desc` says how: `thaw` of a suspended sandbox or `start` of a new one), `upstream` (the
    sandbox's time to the answer's head). Built of bytes: `wakeful up` sends it on every
    answer, and formatting three floats cost a third as much as the rest of the request's
    bookkeeping."""
    queue = _ms(queued)
    if not woke:  # most answers: two fields
        return b"queue;dur=" + queue + b", upstream;dur=" + _ms(upstream)
    wake = b"wake;dur=" + _ms(woke)
    if woke_by in ("thaw", "start"):
        wake += b';desc="' + woke_by.encode() + b'"'
    return b"queue;dur=" + queue + b", " + wake + b", upstream;dur=" + _ms(upstream)


def _tenths(tenths: int) -> bytes:
    return b"%d.%d" % (tenths // 10, tenths % 10)


_TENTHS: Final = tuple(_tenths(tenths) for tenths in range(1000))
"""`_ms`'s answers below 100 ms (most), made once."""


def _ms(seconds: float) -> bytes:
    """`seconds` (none below 0: a negative time is 0) in milliseconds to a tenth, rounded half
    up (`0.00025` is `0.3`)."""
    tenths = int(max(seconds, 0.0) * 10_000 + 0.5)
    if tenths < 1000:
        return _TENTHS[tenths]
    return _tenths(tenths)
