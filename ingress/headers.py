"""Header rules for both directions, as pure functions of the headers and a few facts.

Headers arrive as ASGI gives them (lower-case names); values are latin-1 strings one way
and bytes the other, as the transport and the ASGI server each want them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence

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


def connection_named(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Every header the Connection header(s) name: they are hop-by-hop for this message."""
    named: set[str] = set()
    for name, value in headers:
        if name == "connection":
            named.update(token.strip().lower() for token in value.split(",") if token.strip())
    return frozenset(named)


def header_bytes(target: str, headers: Sequence[tuple[bytes, bytes]]) -> int:
    """The size the request line and headers took on the wire, near enough for a bound."""
    return len(target) + sum(len(name) + len(value) + 4 for name, value in headers)


def request_id_of(headers: Iterable[tuple[str, str]]) -> str:
    """The client's X-Request-Id when it is sane, else a fresh one."""
    for name, value in headers:
        if name == REQUEST_ID and _SANE_ID.match(value):
            return value
    return uuid.uuid4().hex


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
    drop = HOP_BY_HOP | connection_named(headers) | FORWARDED | {REQUEST_ID}
    out = [(name, value) for name, value in headers if name not in drop]
    incoming = {name: value for name, value in headers if name in FORWARDED}
    chain = incoming.get("x-forwarded-for") if trust_forwarded else None
    out.append(("x-forwarded-for", f"{chain}, {client_ip}" if chain else client_ip))
    proto = incoming.get("x-forwarded-proto") if trust_forwarded else None
    out.append(("x-forwarded-proto", proto or scheme))
    forwarded_host = incoming.get("x-forwarded-host") if trust_forwarded else None
    out.append(("x-forwarded-host", forwarded_host or host_of(headers)))
    if trust_forwarded and "forwarded" in incoming:
        out.append(("forwarded", incoming["forwarded"]))
    out.append((REQUEST_ID, request_id))
    return out


def client_response_headers(
    raw: Iterable[tuple[bytes, bytes]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """What the client sees: hop-by-hop gone, our X-Request-Id echoed (the sandbox's dropped)."""
    pairs = [(name.lower(), value) for name, value in raw]
    named = connection_named((n.decode("latin-1"), v.decode("latin-1")) for n, v in pairs)
    drop = {h.encode() for h in HOP_BY_HOP | named} | {REQUEST_ID.encode()}
    out = [(name, value) for name, value in pairs if name not in drop]
    out.append((REQUEST_ID.encode(), request_id.encode("latin-1")))
    return out
