"""Header rules for both directions, as pure functions of the headers and a few facts.

Headers arrive as ASGI gives them (lower-case names); values are latin-1 strings one way
and bytes the other, as the transport and the ASGI server each want them. These run once or
twice per proxied request: each reads the headers in one pass, and the sets they test
against are built once, here, not per call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""RFC 9110 §7.6.1 plus the legacy Proxy-Connection: meaningful for one hop only."""

FORWARDED = frozenset({"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "forwarded"})
REQUEST_ID = "x-request-id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,200}$")

_UPSTREAM_DROP = HOP_BY_HOP | FORWARDED | {REQUEST_ID, "expect"}
"""Never forwarded as received: X-Forwarded-* and X-Request-Id are set anew; the ingress
answers `Expect: 100-continue` itself (the server sends 100 when the body is first read)."""
_RESPONSE_DROP = frozenset(h.encode() for h in HOP_BY_HOP | {REQUEST_ID})
_REQUEST_ID_BYTES = REQUEST_ID.encode()
_NOTABLE = frozenset({"host", REQUEST_ID, "content-length", "transfer-encoding"})


class RequestHead(NamedTuple):
    """What the edge needs of the request headers, read in one pass."""

    headers: list[tuple[str, str]]
    """Every header, latin-1 decoded, in order."""
    host: str
    """The first Host header ("" when none)."""
    client_request_id: str | None
    """The first sane X-Request-Id the client sent."""
    has_body: bool
    """A non-zero Content-Length, or any Transfer-Encoding."""
    size: int
    """The size the headers took on the wire (name, value, ": " and CRLF), near enough for
    a bound on the request head."""
    hosts: int
    """How many Host headers came: more than one is refused (RFC 9112 §3.2), or the route
    would follow one and the sandbox might read the other."""


def read_request_head(raw: Iterable[tuple[bytes, bytes]]) -> RequestHead:
    """Decode the ASGI headers and pick out what routing, ids and body handling need, in one
    pass over them rather than one pass for each."""
    headers: list[tuple[str, str]] = []
    append = headers.append
    host: str | None = None
    hosts = 0
    request_id: str | None = None
    has_body = False
    size = 0
    for raw_name, raw_value in raw:
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1")
        append((name, value))
        size += len(raw_name) + len(raw_value) + 4
        if name in _NOTABLE:
            if name == "host":
                hosts += 1
                if host is None:
                    host = value
            elif name == REQUEST_ID:
                if request_id is None and _SANE_ID.match(value):
                    request_id = value
            elif name == "transfer-encoding" or value.strip() not in ("", "0"):
                has_body = True
    return RequestHead(headers, host or "", request_id, has_body, size, hosts)


class _RequestIds:
    """32 random hex digits (as many as a UUID's) per id, from the OS's CSPRNG, read 4 KiB at
    a time: one `getrandom` call per 256 requests instead of one per request."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        if self._at >= len(self._pool):
            self._pool, self._at = os.urandom(4096), 0
        at = self._at
        self._at = at + 16
        return self._pool[at : at + 16].hex()


new_request_id = _RequestIds()


def connection_named(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Every header the Connection header(s) name: they are hop-by-hop for this message."""
    named: set[str] = set()
    for name, value in headers:
        if name == "connection":
            named.update(token.strip().lower() for token in value.split(",") if token.strip())
    return frozenset(named)


def host_of(headers: Iterable[tuple[str, str]]) -> str:
    for name, value in headers:
        if name == "host":
            return value
    return ""


def upstream_request_headers(
    headers: Sequence[tuple[str, str]],
    *,
    client_ip: str,
    scheme: str,
    request_id: str,
    trust_forwarded: bool,
) -> list[tuple[str, str]]:
    """What the sandbox sees: hop-by-hop gone, X-Forwarded-* set, X-Request-Id present.

    An incoming forwarding chain is kept (and appended to) only when the peer is trusted;
    otherwise a client could claim any address.
    """
    named = connection_named(headers)
    drop = _UPSTREAM_DROP | named if named else _UPSTREAM_DROP
    out = [(name, value) for name, value in headers if name not in drop]
    if trust_forwarded:
        incoming = {name: value for name, value in headers if name in FORWARDED}
        chain = incoming.get("x-forwarded-for")
        out.append(("x-forwarded-for", f"{chain}, {client_ip}" if chain else client_ip))
        out.append(("x-forwarded-proto", incoming.get("x-forwarded-proto") or scheme))
        forwarded_host = incoming.get("x-forwarded-host")
        out.append(("x-forwarded-host", forwarded_host or host_of(headers)))
        if "forwarded" in incoming:
            out.append(("forwarded", incoming["forwarded"]))
    else:
        out.append(("x-forwarded-for", client_ip))
        out.append(("x-forwarded-proto", scheme))
        out.append(("x-forwarded-host", host_of(headers)))
    out.append((REQUEST_ID, request_id))
    return out


def client_response_headers(
    raw: Iterable[tuple[bytes, bytes]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """What the client sees: hop-by-hop gone, our X-Request-Id echoed (the sandbox's dropped)."""
    pairs = [(name.lower(), value) for name, value in raw]
    drop = _RESPONSE_DROP
    for name, value in pairs:
        if name == b"connection":
            named = {token.strip().lower() for token in value.split(b",")}
            named.discard(b"")
            drop = drop | named
    out = [(name, value) for name, value in pairs if name not in drop]
    out.append((_REQUEST_ID_BYTES, request_id.encode("latin-1")))
    return out
