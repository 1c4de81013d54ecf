"""The answer-head rules (`upstream.rules`) as tables: which status is the answer, where a
body without framing ends, which framing is refused, and the bound on framing read in a
row."""

from __future__ import annotations

import httptools
import pytest

from wakeful.ingress.errors import UpstreamFailed
from wakeful.ingress.upstream.rules import (
    FINAL,
    INFORMATIONAL,
    MAX_FRAMING_BYTES,
    SWITCH,
    Head,
    callback_error,
    framed_by_close,
    framing_refused,
    framing_run,
    judge_status,
)


@pytest.mark.parametrize(
    ("status", "handshake", "expected"),
    [
        pytest.param(200, False, FINAL, id="200 is the answer"),
        pytest.param(204, False, FINAL, id="204 is the answer"),
        pytest.param(599, False, FINAL, id="599 is the answer"),
        pytest.param(100, False, INFORMATIONAL, id="100 Continue: the answer follows"),
        pytest.param(103, False, INFORMATIONAL, id="103 Early Hints: the answer follows"),
        pytest.param(199, False, INFORMATIONAL, id="any 1xx: the answer follows"),
        pytest.param(
            101, False, "the sandbox switched protocols unasked", id="101 to a plain request"
        ),
        pytest.param(101, True, SWITCH, id="101 to a handshake switches"),
        pytest.param(100, True, INFORMATIONAL, id="100 to a handshake: the answer follows"),
        pytest.param(426, True, FINAL, id="a handshake refused: the answer, passed on"),
        pytest.param(0, False, "the sandbox answered with status 0", id="status 000"),
        pytest.param(99, True, "the sandbox answered with status 99", id="status 99"),
        pytest.param(600, False, "the sandbox answered with status 600", id="status 600"),
        pytest.param(999, True, "the sandbox answered with status 999", id="status 999"),
    ],
)
def test_judge_status(status: int, handshake: bool, expected: Head | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(UpstreamFailed, match=f"^{expected}$"):
            judge_status(status, handshake)
    else:
        assert judge_status(status, handshake) is expected


@pytest.mark.parametrize(
    ("headers", "by_close"),
    [
        pytest.param([], True, id="no headers: the body ends with the connection"),
        pytest.param([(b"Content-Type", b"text/plain")], True, id="no framing header"),
        pytest.param([(b"Content-Length", b"2")], False, id="a Content-Length frames it"),
        pytest.param([(b"content-length", b"0")], False, id="a Content-Length of 0 too"),
        pytest.param([(b"Transfer-Encoding", b"chunked")], False, id="chunked frames it"),
        pytest.param([(b"TRANSFER-ENCODING", b"gzip")], False, id="names in any case"),
    ],
)
def test_framed_by_close(headers: list[tuple[bytes, bytes]], by_close: bool) -> None:
    assert framed_by_close(headers) is by_close


@pytest.mark.parametrize(
    ("run", "read", "body_came", "after", "refused"),
    [
        pytest.param(0, 120, False, 120, False, id="a head in one read"),
        pytest.param(1000, 500, True, 0, False, id="a read that brought body starts again"),
        pytest.param(
            MAX_FRAMING_BYTES - 10, 10, False, MAX_FRAMING_BYTES, False, id="at the bound"
        ),
        pytest.param(
            MAX_FRAMING_BYTES - 10, 11, False, MAX_FRAMING_BYTES + 1, True, id="past the bound"
        ),
        pytest.param(MAX_FRAMING_BYTES, 1 << 20, True, 0, False, id="much body after long framing"),
    ],
)
def test_framing_run(run: int, read: int, body_came: bool, after: int, refused: bool) -> None:
    assert framing_run(run, read, body_came) == after
    assert (after > MAX_FRAMING_BYTES) is refused


@pytest.mark.parametrize(
    ("headers", "interim", "refused"),
    [
        pytest.param([(b"Content-Length", b"2")], False, None, id="an answer's length"),
        pytest.param([(b"Transfer-Encoding", b"chunked")], False, None, id="chunked"),
        pytest.param([(b"transfer-encoding", b" Chunked ")], False, None, id="any case, padded"),
        pytest.param(
            [(b"Transfer-Encoding", b"gzip, chunked")], False, "coded", id="gzip, chunked"
        ),
        pytest.param([(b"Transfer-Encoding", b"gzip")], False, "coded", id="gzip alone"),
        pytest.param([(b"Transfer-Encoding", b"identity")], False, "coded", id="identity"),
        pytest.param([], True, None, id="a bare 1xx head"),
        pytest.param([(b"Content-Length", b"0")], True, None, id="a 1xx saying 0"),
        pytest.param([(b"Content-Length", b"5")], True, "interim", id="a 1xx framing 5 bytes"),
        pytest.param([(b"Transfer-Encoding", b"chunked")], True, "interim", id="a chunked 1xx"),
    ],
)
def test_framing_refused(
    headers: list[tuple[bytes, bytes]], interim: bool, refused: str | None
) -> None:
    why = framing_refused(headers, interim)
    assert (why is None) if refused is None else (why is not None and refused in why)


def test_callback_error() -> None:
    """Only httptools' report of a callback's failure carries our error; any other parse
    error's context is whatever was being handled then (a stale ClosedUnanswered, once)."""
    ours = UpstreamFailed("ours")
    reported = httptools.HttpParserCallbackError("the on_headers_complete callback failed")
    reported.__context__ = ours
    assert callback_error(reported) is ours
    stale = httptools.HttpParserError("Pause on CONNECT/Upgrade")
    stale.__context__ = UpstreamFailed("an earlier exchange's")
    assert callback_error(stale) is None
    assert callback_error(httptools.HttpParserError("bad")) is None
