"""The request-head rules (`http1.rules.frame_request`) as a table: each head, the framing it
gets or the reason it is refused. Smuggling shapes first: the rules refuse them by themselves,
whatever the parser in front of them lets through (`test_heads.py` sends the same shapes
through the real server)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wakeful.ingress.errors import BadRequest
from wakeful.ingress.http1.rules import (
    HEAD_DUE,
    IDLE_DUE,
    NOT_DUE,
    RequestFrame,
    frame_request,
    known_version,
    origin_form,
    passed,
)

Head = list[tuple[bytes, bytes]]
HOST = (b"host", b"hello.localhost")
WS = [HOST, (b"connection", b"Upgrade"), (b"upgrade", b"websocket")]


def frame(
    body: bool = False, expect: bool = False, upgrade: bool = False, keep: bool = True
) -> RequestFrame:
    return RequestFrame(body, expect, upgrade, keep)


def cl(value: bytes) -> Head:
    return [HOST, (b"content-length", value)]


def te(*values: bytes) -> Head:
    return [HOST, *((b"transfer-encoding", value) for value in values)]


@dataclass(frozen=True)
class Refused:
    reason: str


@pytest.mark.parametrize(
    ("method", "version", "headers", "parser_upgrade", "keep", "expected"),
    [
        # -- request smuggling: one way to read where a request ends, or none ----------
        pytest.param(
            "POST",
            "1.1",
            [*cl(b"5"), (b"transfer-encoding", b"chunked")],
            False,
            True,
            Refused("Content-Length with Transfer-Encoding"),
            id="Content-Length and Transfer-Encoding together are refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            [*te(b"chunked"), (b"content-length", b"5")],
            False,
            True,
            Refused("Content-Length with Transfer-Encoding"),
            id="Transfer-Encoding then Content-Length is refused as well",
        ),
        pytest.param(
            "POST",
            "1.0",
            [*te(b"chunked"), (b"content-length", b"3")],
            False,
            False,
            Refused("Content-Length with Transfer-Encoding"),
            id="Transfer-Encoding and Content-Length in HTTP/1.0 are refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            [*cl(b"5"), (b"content-length", b"5")],
            False,
            True,
            Refused("two Content-Length headers"),
            id="two equal Content-Lengths are refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            [*cl(b"5"), (b"content-length", b"6")],
            False,
            True,
            Refused("two Content-Length headers"),
            id="two different Content-Lengths are refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"5, 5"),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="a Content-Length list is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"+5"),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="a Content-Length with a plus sign is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"-5"),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="a negative Content-Length is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"5 5"),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="a Content-Length with a space inside is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"0x5"),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="a hexadecimal Content-Length is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b""),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="an empty Content-Length is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"\r\n 5"),
            False,
            True,
            Refused("Content-Length is not a number"),
            id="an obs-fold left in a Content-Length is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"chunked, identity"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="chunked, identity is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"chunked, gzip"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="chunked not last is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"gzip, chunked"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="gzip, chunked is refused: the ingress decodes no other coding",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"gzip"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="a coding without chunked is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"identity"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="identity is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"chunked;ext=1"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="chunked with a parameter is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"xchunked"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="a coding that only ends in chunked is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b""),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="an empty Transfer-Encoding is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"\r\n chunked"),
            False,
            True,
            Refused("unsupported transfer-encoding"),
            id="an obs-fold left in a Transfer-Encoding is refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            te(b"chunked", b"chunked"),
            False,
            True,
            Refused("two Transfer-Encoding headers"),
            id="two Transfer-Encoding headers are refused",
        ),
        # -- framing -------------------------------------------------------------------
        pytest.param("GET", "1.1", [HOST], False, True, frame(), id="a GET without framing"),
        pytest.param(
            "GET",
            "1.1",
            [HOST, (b"connection", b"close")],
            False,
            False,
            frame(keep=False),
            id="Connection: close is the last request",
        ),
        pytest.param("GET", "1.0", [HOST], False, False, frame(keep=False), id="HTTP/1.0"),
        pytest.param("POST", "1.1", cl(b"5"), False, True, frame(body=True), id="a length"),
        pytest.param("POST", "1.1", cl(b"0"), False, True, frame(), id="a zero length: no body"),
        pytest.param(
            "POST",
            "1.1",
            cl(b"005"),
            False,
            True,
            frame(body=True),
            id="leading zeros are still a length",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b"00"),
            False,
            True,
            frame(body=True),
            id="a length of 00 is an empty body, not none",
        ),
        pytest.param(
            "POST",
            "1.1",
            cl(b" 5\t"),
            False,
            True,
            frame(body=True),
            id="whitespace around a length is cut",
        ),
        pytest.param("POST", "1.1", te(b"chunked"), False, True, frame(body=True), id="chunked"),
        pytest.param(
            "POST",
            "1.1",
            te(b"Chunked "),
            False,
            True,
            frame(body=True),
            id="chunked in any case, whitespace cut",
        ),
        pytest.param(
            "POST",
            "1.0",
            te(b"chunked"),
            False,
            False,
            frame(body=True, keep=False),
            id="chunked in HTTP/1.0 is read as chunked, and the connection closes after",
        ),
        pytest.param(
            "GET",
            "1.1",
            cl(b"3"),
            False,
            True,
            frame(body=True),
            id="a GET may have a body",
        ),
        # -- Expect ----------------------------------------------------------------------
        pytest.param(
            "POST",
            "1.1",
            [*cl(b"5"), (b"expect", b"100-continue")],
            False,
            True,
            frame(body=True, expect=True),
            id="Expect: 100-continue with a body: 100 when the body is first read",
        ),
        pytest.param(
            "POST",
            "1.1",
            [*te(b"chunked"), (b"expect", b"100-Continue")],
            False,
            True,
            frame(body=True, expect=True),
            id="Expect: 100-continue in any case",
        ),
        pytest.param(
            "POST",
            "1.0",
            [*cl(b"5"), (b"expect", b"100-continue")],
            False,
            False,
            frame(body=True, keep=False),
            id="Expect in HTTP/1.0 is not an expectation",
        ),
        pytest.param(
            "GET",
            "1.1",
            [HOST, (b"expect", b"100-continue")],
            False,
            True,
            frame(),
            id="Expect without a body has nothing to continue",
        ),
        pytest.param(
            "POST",
            "1.1",
            [*cl(b"5"), (b"expect", b"200-ok")],
            False,
            True,
            frame(body=True),
            id="another expectation is ignored, not answered 417",
        ),
        # -- upgrades --------------------------------------------------------------------
        pytest.param(
            "GET",
            "1.1",
            WS,
            True,
            True,
            frame(upgrade=True, keep=False),
            id="a WebSocket handshake switches; nothing after it is HTTP",
        ),
        pytest.param(
            "GET",
            "1.1",
            [HOST, (b"connection", b"keep-alive, Upgrade"), (b"upgrade", b"foo, WebSocket")],
            True,
            True,
            frame(upgrade=True, keep=False),
            id="upgrade and websocket among other tokens",
        ),
        pytest.param(
            "GET",
            "1.0",
            WS,
            True,
            False,
            frame(keep=False),
            id="a WebSocket handshake in HTTP/1.0 is a plain request",
        ),
        pytest.param(
            "POST",
            "1.1",
            WS,
            True,
            True,
            frame(),
            id="a POST is no WebSocket handshake",
        ),
        pytest.param(
            "GET",
            "1.1",
            [HOST, (b"connection", b"Upgrade, HTTP2-Settings"), (b"upgrade", b"h2c")],
            True,
            True,
            frame(),
            id="h2c is a plain request (the parser then stops: it is the last)",
        ),
        pytest.param(
            "CONNECT",
            "1.1",
            [HOST],
            True,
            True,
            frame(),
            id="CONNECT is not switched to (the edge refuses it)",
        ),
        pytest.param(
            "GET",
            "1.1",
            WS,
            False,
            True,
            frame(),
            id="no upgrade unless the parser stopped for one",
        ),
        pytest.param(
            "GET",
            "1.1",
            [*WS, (b"content-length", b"5")],
            True,
            True,
            Refused("an upgrade request with a body"),
            id="a WebSocket handshake with a body: refused (the parser would not read it)",
        ),
        pytest.param(
            "POST",
            "1.1",
            [
                HOST,
                (b"connection", b"Upgrade"),
                (b"upgrade", b"foo"),
                (b"transfer-encoding", b"chunked"),
            ],
            True,
            True,
            Refused("an upgrade request with a body"),
            id="any upgrade with a chunked body: refused",
        ),
        pytest.param(
            "POST",
            "1.1",
            [HOST, (b"connection", b"Upgrade"), (b"upgrade", b"foo"), (b"content-length", b"0")],
            True,
            True,
            frame(),
            id="an upgrade with an empty body is no body",
        ),
    ],
)
def test_frame_request(
    method: str,
    version: str,
    headers: Head,
    parser_upgrade: bool,
    keep: bool,
    expected: RequestFrame | Refused,
) -> None:
    if isinstance(expected, Refused):
        with pytest.raises(BadRequest, match=f"^{expected.reason}$"):
            frame_request(method, version, headers, parser_upgrade, keep)
    else:
        assert frame_request(method, version, headers, parser_upgrade, keep) == expected


@pytest.mark.parametrize(
    ("keep_alive", "connection_header", "known"),
    [
        (True, False, "1.1"),  # llhttp keeps only 1.1 alive unasked
        (True, True, None),  # a Connection (or Proxy-Connection) token: 1.0 and 2.0 can be kept
        (False, False, None),  # 1.0, 0.9, 2.0 without one
        (False, True, None),
    ],
)
def test_known_version(keep_alive: bool, connection_header: bool, known: str | None) -> None:
    assert known_version(keep_alive, connection_header) == known


@pytest.mark.parametrize(
    ("head_due", "idle_due", "now", "expected"),
    [
        pytest.param(10.0, None, 10.0, (HEAD_DUE, None), id="a head's deadline, reached"),
        pytest.param(None, 10.0, 11.0, (IDLE_DUE, None), id="an idle deadline, past"),
        pytest.param(10.0, 10.0, 10.0, (HEAD_DUE, None), id="both: the head's first"),
        pytest.param(12.0, 15.0, 11.0, (NOT_DUE, 12.0), id="neither yet: the earlier next"),
        pytest.param(None, 15.0, 11.0, (NOT_DUE, 15.0), id="only the idle one, later"),
        pytest.param(20.0, None, 11.0, (NOT_DUE, 20.0), id="only the head's, later"),
        pytest.param(None, None, 11.0, (NOT_DUE, None), id="none set: nothing to re-arm"),
    ],
)
def test_passed(
    head_due: float | None, idle_due: float | None, now: float, expected: tuple[int, float | None]
) -> None:
    assert passed(head_due, idle_due, now) == expected


@pytest.mark.parametrize(
    ("url", "target", "host"),
    [
        (b"/a?b", b"/a?b", b"given"),  # origin-form: as it is
        (b"http://hello.localhost/x?y=1", b"/x?y=1", b"hello.localhost"),
        (b"HTTPS://hello.localhost:8443", b"/", b"hello.localhost:8443"),
        (b"http://hello.localhost?q", b"/?q", b"hello.localhost"),
        (b"http://a.b/c#frag", b"/c#frag", b"a.b"),
        (b"*", b"*", b"given"),  # refused by the edge, as no path
        (b"hello.localhost:80", b"hello.localhost:80", b"given"),  # authority-form: the same
        (b"ftp://a.b/c", b"ftp://a.b/c", b"given"),
        (b"http:///c", b"http:///c", b"given"),  # no host
        (b"http://user@a.b/c", b"http://user@a.b/c", b"given"),  # a user: RFC 9110 §4.2.4
    ],
)
def test_origin_form(url: bytes, target: bytes, host: bytes) -> None:
    headers = [(b"host", b"given"), (b"accept", b"*/*")]
    got, fields = origin_form(url, headers)
    assert got == target
    assert [value for name, value in fields if name == b"host"] == [host]
    assert (b"accept", b"*/*") in fields
