"""What an HTTP/2 client may do, as pure rules: how its connection is told from HTTP/1.1's
(the preface, ALPN), and a stream's head as the edge reads a request: the fields HTTP/2
forbids or malforms (`malformed_request`, `malformed_answer`, `malformed_trailers`), and a
request head fit for the exchange (`request_head`). The frames and budgets a connection is
held to before the wire parses them are `http2.budgets`.
"""

from __future__ import annotations

import re
import ssl
from typing import Final

from wakeful.ingress.errors import BadRequest

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What an HTTP/2 client sends first (RFC 9113 §3.4): on the plain listener, how an h2c
client with prior knowledge is told from an HTTP/1.1 one."""


def sniff(first: bytes) -> bool | None:
    """Whether a plain connection's first bytes are the HTTP/2 preface: True, False, or None
    while too few have come to tell."""
    if len(first) >= len(PREFACE):
        return first.startswith(PREFACE)
    return None if PREFACE.startswith(first) else False


def chose_h2(tls: ssl.SSLObject | None) -> bool:
    """Whether a TLS connection's handshake chose HTTP/2 (ALPN `h2`)."""
    return tls is not None and tls.selected_alpn_protocol() == "h2"


CONNECTION_SPECIFIC: Final = frozenset(
    (b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade")
)
"""Fields HTTP/2 forbids (RFC 9113 §8.2.2)."""
PSEUDO: Final = frozenset(
    (b":method", b":scheme", b":authority", b":path", b":status", b":protocol")
)
"""The pseudo-header fields there are (RFC 9113 §8.3, RFC 8441 §4)."""


_NAME: Final = re.compile(rb":?[!-9;-@\[-~]+")
"""A field name HTTP/2 takes (RFC 9113 §8.2.1): visible ASCII but upper case, no colon but
a pseudo-header's first."""
_NUL_CR_LF: Final = re.compile(rb"[\x00\n\r]")


def field_error(name: bytes, value: bytes) -> str | None:
    """What is wrong with one received field (RFC 9113 §8.2.1, §8.2.2), None if nothing: h2's
    inbound rules, which the ingress runs itself (`malformed_request`)."""
    if _NAME.fullmatch(name) is None:
        return _name_error(name)
    if value:
        if _NUL_CR_LF.search(value) is not None:
            return f"the value of {name[:40]!r} carries NUL, CR or LF"
        if value[0] in (0x20, 0x09) or value[-1] in (0x20, 0x09):
            return f"the value of {name[:40]!r} begins or ends with white space"
    if name == b"te" and value.lower() != b"trailers":
        return "TE other than trailers"
    if name in CONNECTION_SPECIFIC:
        return f"a connection-specific field {name!r}"
    return None


def _name_error(name: bytes) -> str:
    if not name:
        return "an empty header name"
    for octet in name:
        if 0x41 <= octet <= 0x5A:
            return f"an upper-case header name {name[:40]!r}"
        if octet <= 0x20 or octet >= 0x7F:
            return f"a header name with {chr(octet)!r} in it"
    if name.find(b":", 1) != -1:
        return f"a header name with ':' inside it {name[:40]!r}"
    return "a pseudo-header field with no name"


def malformed_request(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header block is malformed (RFC 9113 §8.1.1), None if it is not: each
    field's rules (`field_error`), then the pseudo-headers' (each at most once, known, before
    every other field; `:method`, and `:scheme` and `:path` unless a plain CONNECT, which has
    neither; no `:status`; `:protocol` with CONNECT only; `:path` not empty) and the host's
    (`:authority` or Host, one Host, the two the same). These are h2's `validate_headers`,
    rule for rule (the differential test holds them to it), compiled: its generators cost a
    tenth of a small request's CPU, and a malformed request is the stream error RFC 9113
    makes it, where h2 made it a connection's."""
    seen: set[bytes] = set()
    regular = False
    method: bytes | None = None
    authority: bytes | None = None
    host: bytes | None = None
    for name, value in headers:
        error = field_error(name, value)
        if error is not None:
            return error
        if name[0] == 0x3A:
            if name in seen:
                return f"a pseudo-header field twice: {name!r}"
            seen.add(name)
            if regular:
                return f"a pseudo-header field after the others: {name!r}"
            if name not in PSEUDO:
                return f"an unknown pseudo-header field {name[:40]!r}"
            if name == b":method":
                method = value
            elif name == b":authority":
                authority = value
            elif name == b":path" and not value:
                return "an empty :path"
        else:
            regular = True
            if name == b"host":
                if host is not None:
                    return "two Host fields"
                host = value
    if b":method" not in seen:
        return "no :method"
    connect = method == b"CONNECT"
    if connect and b":protocol" not in seen:
        if b":scheme" in seen or b":path" in seen:
            return "a CONNECT with :scheme or :path"
    elif b":scheme" not in seen or b":path" not in seen:
        return "no :scheme or no :path"
    if b":status" in seen:
        return "a :status in a request"
    if not connect and b":protocol" in seen:
        return ":protocol without CONNECT"
    if authority is None and host is None:
        return "neither :authority nor Host"
    if authority is not None and host is not None and authority != host:
        return ":authority and Host differ"
    return None


def malformed_answer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why an answer's head from an h2c sandbox is malformed (RFC 9113 §8.3.2), None if it is
    not: each field's rules, and one `:status` its only pseudo-header field, first. `h2`'s
    `validate_headers` for a client, rule for rule (test_malformed)."""
    status = False
    regular = False
    for name, value in headers:
        error = field_error(name, value)
        if error is not None:
            return error
        if name[0] == 0x3A:
            if regular:
                return f"a pseudo-header field after the others: {name!r}"
            if name != b":status":
                return f"a pseudo-header field an answer may not carry: {name[:40]!r}"
            if status:
                return "a pseudo-header field twice: b':status'"
            status = True
        else:
            regular = True
    return None if status else "no :status"


def malformed_trailers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why trailers are malformed (each field's rules; no pseudo-header field), or None."""
    for name, value in headers:
        error = field_error(name, value)
        if error is not None:
            return error
        if name[0] == 0x3A:
            return f"a pseudo-header field in trailers: {name!r}"
    return None


_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""RFC 9110 §5.6.2: what a method may be."""
_VISIBLE = re.compile(rb"[\x21-\x7e]+")
"""Visible ASCII: what a request target and a host are (llhttp refuses the rest on HTTP/1.1)."""
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""Controls HTTP/1.1 field values may not carry (h2 refuses NUL, CR and LF only)."""


def request_head(
    headers: list[tuple[bytes, bytes]], ended: bool
) -> tuple[str, bytes, list[tuple[bytes, bytes]], int | None]:
    """An HTTP/2 request's head as the edge reads an HTTP/1.1 one: method, target, the headers
    with `host` first (from `:authority`, else the Host header), and the Content-Length it
    declares (None: none). BadRequest for a malformed one (`malformed_request`) and for what
    HTTP/1.1 would not carry; this joins split cookies (RFC 9113 §8.2.3: an HTTP/1.1 sandbox
    expects one) and keeps `te` only as `trailers`.

    The length is what an HTTP/1.1 sandbox frames the body by: one that is not what comes
    would have it read the next request on its connection as this one's body (a smuggled
    request). So a head that ended its stream (`ended`: no body) may declare 0 at most
    (RFC 9113 §8.1.1), and one value goes on (a length that is not digits, or two that differ,
    are refused); the body's own length is held to it as it comes (`StreamBody.long`: the
    stream is reset past it) and as it ends (`StreamBody.end`)."""
    error = malformed_request(headers)
    if error is not None:
        raise BadRequest(f"a malformed request: {error}")
    method = b""
    path = b""
    authority = b""
    host = b""
    length: int | None = None
    out: list[tuple[bytes, bytes]] = []
    cookies: list[bytes] = []
    for name, value in headers:
        if name[:1] == b":":
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
            elif name == b":protocol":
                raise BadRequest("extended CONNECT (RFC 8441) is not served here")
            continue
        if name == b"host":
            host = host or value
        elif name == b"cookie":
            cookies.append(value)
        elif name == b"te":
            if value.strip().lower() == b"trailers":
                out.append((name, b"trailers"))
        elif name == b"content-length":
            declared = content_length(value)
            if length is None:
                length = declared
                out.append((name, value))
            elif declared != length:
                raise BadRequest("two content-lengths that differ")
        else:
            out.append((name, value))
    if length is not None and (length < 0 or (ended and length)):
        raise BadRequest(f"a content-length of {length} on a stream whose body is not so long")
    if method == b"CONNECT":
        raise BadRequest("CONNECT is not served here")
    if not _TOKEN.fullmatch(method):  # it becomes an HTTP/1.1 request line: `GET /x /`...
        raise BadRequest(f"the :method {method[:40]!r} is not a token")
    if not _VISIBLE.fullmatch(path):
        raise BadRequest("the :path carries what a request line may not (spaces, controls)")
    name = authority or host
    if name and not _VISIBLE.fullmatch(name):
        raise BadRequest("the :authority carries what a Host header may not")
    for field, value in out:
        if not _TOKEN.fullmatch(field):
            raise BadRequest(f"the header name {field[:40]!r} is not a token")
        if _CONTROL.search(value):
            raise BadRequest("a header value carries a control character")
    for value in cookies:
        if _CONTROL.search(value):
            raise BadRequest("a cookie carries a control character")
    if cookies:
        out.append((b"cookie", b"; ".join(cookies)))
    if name:
        out.insert(0, (b"host", name))
    return method.decode("latin-1"), path, out, length


def content_length(value: bytes) -> int:
    """A Content-Length's value, or -1 when it is none: digits only (no sign, no space), fewer
    than an int64's (llhttp's bound); a request's (`request_head`) and an h2c answer's."""
    return int(value) if value.isdigit() and len(value) <= 18 else -1


def fit_for_http1(name: bytes, value: bytes) -> bool:
    """Whether an h2c sandbox's answer field can go on to an HTTP/1.1 client: a token for a
    name, no control but tab in the value. HTTP/2 refuses only NUL, CR and LF, so `x"(a)` or
    a value with \\x01 is valid there and malformed on HTTP/1.1 (strict clients, llhttp's
    among them, refuse the whole answer): such a field is dropped, whoever the client."""
    return _TOKEN.fullmatch(name) is not None and _CONTROL.search(value) is None
