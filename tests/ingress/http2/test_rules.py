"""The HTTP/2 rules (`http2.rules`) and gRPC's (`ingress.grpc`), as tables: the preface sniff, a
stream's head as a request, the frame scan's counts and bound, the budgets, a call's deadline,
its error answers and the status it ended with."""

from __future__ import annotations

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from wakeful.domain.grpcstatus import code_name
from wakeful.ingress import grpc
from wakeful.ingress.errors import BadRequest
from wakeful.ingress.http2.budgets import Budget, FrameScan
from wakeful.ingress.http2.rules import (
    PREFACE,
    content_length,
    fit_for_http1,
    request_head,
    sniff,
)


@pytest.mark.parametrize(
    ("first", "verdict"),
    [
        (b"", None),
        (b"PRI * HT", None),
        (PREFACE[:-1], None),
        (PREFACE, True),
        (PREFACE + b"\x00\x00\x00\x04", True),
        (b"GET / HTTP/1.1\r\n", False),
        (b"P", None),
        (b"POST / HTTP/1.1\r\n", False),
        (b"PRI * HTTP/1.1\r\n\r\n", False),
    ],
)
def test_sniff(first: bytes, verdict: bool | None) -> None:
    assert sniff(first) is verdict


def test_a_budget_allows_its_burst_then_its_rate() -> None:
    budget = Budget(10, 5.0, now=0.0)
    assert budget.spend(10, 0.0)
    assert not budget.spend(1, 0.0)  # overdrawn: the connection would end here
    budget = Budget(10, 5.0, now=0.0)
    assert budget.spend(10, 0.0)
    assert budget.spend(5, 1.0)  # a second refills five
    assert not budget.spend(6, 2.0)
    budget = Budget(10, 5.0, now=0.0)
    assert budget.spend(10, 100.0)  # never more than the burst, however long it rested
    assert not budget.spend(1, 100.0)


def _wire(*frames: Frame) -> bytes:
    return b"".join(frame.serialize() for frame in frames)


def _headers(stream: int, size: int, flags: set[str]) -> HeadersFrame:
    frame = HeadersFrame(stream, data=b"x" * size)
    frame.flags = set(flags)  # type: ignore[assignment]
    return frame


def _continuation(stream: int, size: int, end: bool) -> ContinuationFrame:
    frame = ContinuationFrame(stream, data=b"x" * size)
    if end:
        frame.flags.add("END_HEADERS")
    return frame


def test_the_scan_counts_control_frames_and_resets_across_any_split() -> None:
    data = PREFACE + _wire(
        SettingsFrame(0, settings={4: 65535}),
        SettingsFrame(0, flags=["ACK"]),  # an acknowledgement: counted (one is due)
        PingFrame(0, opaque_data=b"12345678"),
        PriorityFrame(3, depends_on=0, stream_weight=1),
        _headers(3, 20, set()),
        ContinuationFrame(3, data=b""),  # nothing in it: counted (no byte bound counts it)
        ContinuationFrame(3, data=b"x" * 5, flags=["END_HEADERS"]),  # bytes: the block's bound
        _headers(1, 20, {"END_HEADERS"}),
        DataFrame(1, data=b""),  # empty, not the end: counted
        DataFrame(1, data=b"", flags=["END_STREAM"]),  # empty but the end: not
        DataFrame(1, data=b"body"),
        DataFrame(1, data=b"", pad_length=200, flags=["PADDED"]),  # padding alone: counted
        WindowUpdateFrame(0, window_increment=100),
        RstStreamFrame(1, error_code=8),
        RstStreamFrame(3, error_code=8),
    )
    for step in (1, 2, 5, 9, 10, len(data)):  # bytes per read: frame headers split anywhere
        scan = FrameScan(1024, preface=True)
        control = resets = 0
        for at in range(0, len(data), step):
            seen = scan.feed(data[at : at + step])
            assert seen.refusal is None
            control += seen.control
            resets += seen.resets
        assert (control, resets) == (7, 2), step


def test_the_clients_goaway_is_taken_out_of_what_the_wire_gets_however_it_is_split() -> None:
    before = _wire(
        _headers(1, 20, {"END_HEADERS", "END_STREAM"}), PingFrame(0, opaque_data=b"p" * 8)
    )
    goaway = _wire(GoAwayFrame(0, last_stream_id=77, error_code=0, additional_data=b"bye"))
    after = _wire(WindowUpdateFrame(1, window_increment=10), RstStreamFrame(3, error_code=8))
    data = PREFACE + before + goaway + after
    for step in (1, 2, 7, 9, 13, len(data)):
        scan = FrameScan(1024, preface=True)
        given = b""
        went = False
        last = []
        for at in range(0, len(data), step):
            seen = scan.feed(data[at : at + step])
            given += seen.data
            went = went or seen.goaway
            if seen.goaway_last is not None:
                last.append(seen.goaway_last)
        assert given == PREFACE + before + after, step  # in order, whole, less the GOAWAY
        assert went and last == [77], step  # and the last stream it names, read once
    scan = FrameScan(1024, preface=False)
    whole = scan.feed(before)
    assert whole.data is before and not whole.goaway  # the common read: passed on as it is


def test_a_header_block_past_its_bound_is_refused_however_it_is_split() -> None:
    scan = FrameScan(1000, preface=False)
    assert scan.feed(_wire(_headers(1, 400, set()))).refusal is None
    assert scan.open_block
    assert scan.feed(_wire(_continuation(1, 400, False))).refusal is None
    refused = scan.feed(_wire(_continuation(1, 400, False))).refusal
    assert refused is not None and "1200" in refused
    # A block that ends within the bound closes: the next one starts from nothing.
    scan = FrameScan(1000, preface=False)
    seen = scan.feed(_wire(_headers(1, 600, set()), _continuation(1, 300, True)))
    assert seen.refusal is None and not scan.open_block
    assert scan.feed(_wire(_headers(3, 900, {"END_HEADERS"}))).refusal is None


def test_a_stream_head_reads_as_a_request() -> None:
    method, target, fields, length = request_head(
        [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":authority", b"shop.example.com"),
            (b":path", b"/cart?x=1"),
            (b"cookie", b"a=1"),
            (b"content-type", b"application/grpc"),
            (b"cookie", b"b=2"),
            (b"te", b"trailers"),
        ],
        False,
    )
    assert (method, target, length) == ("POST", b"/cart?x=1", None)
    assert fields == [
        (b"host", b"shop.example.com"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"cookie", b"a=1; b=2"),  # one, as an HTTP/1.1 sandbox expects (RFC 9113 §8.2.3)
    ]
    # No :authority: the Host header names the app, once.
    head = [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b"host", b"a.b")]
    _, _, fields, _ = request_head(head, True)
    assert fields == [(b"host", b"a.b")]


@pytest.mark.parametrize(
    "head",
    [
        [(b":method", b"CONNECT"), (b":authority", b"db:5432")],
        [(b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":path", b"/")],
        [(b":method", b"GET"), (b":path", b"/a b")],
    ],
)
def test_what_a_stream_head_may_not_ask(head: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(BadRequest):
        request_head(head, True)


_GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"a")]


@pytest.mark.parametrize(
    ("lengths", "ended", "declared"),
    [
        ([], True, None),
        ([], False, None),
        ([b"0"], True, 0),  # a length of 0 and no body: what it says
        ([b"40"], False, 40),  # the body's own length is held to it as it ends (StreamBody)
        ([b"40"], True, BadRequest),  # no body: a sandbox would read the next request as it
        ([b"1"], True, BadRequest),
        ([b"40", b"40"], False, 40),  # one goes on (h2 refuses two that differ)
        ([b"4x"], False, BadRequest),
    ],
)
def test_a_stream_head_s_content_length(
    lengths: list[bytes], ended: bool, declared: int | type[BadRequest] | None
) -> None:
    head = _GET + [(b"content-length", value) for value in lengths]
    if declared is BadRequest:
        with pytest.raises(BadRequest):
            request_head(head, ended)
        return
    _, _, fields, length = request_head(head, ended)
    assert length == declared
    assert [v for n, v in fields if n == b"content-length"] == lengths[:1]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"5S", 5.0),
        (b"100m", 0.1),
        (b"2M", 120.0),
        (b"1H", 3600.0),
        (b"250u", 250e-6),
        (b"99999999n", 0.099999999),
        (None, None),
        (b"", None),
        (b"5", None),
        (b"123456789S", None),  # nine digits: more than the spec's eight
        (b"-1S", None),
        (b"1.5S", None),
    ],
)
def test_parse_timeout(value: bytes | None, seconds: float | None) -> None:
    parsed = grpc.parse_timeout(value)
    if seconds is None:
        assert parsed is None
    else:
        assert parsed == pytest.approx(seconds)


def test_a_timeout_is_sent_on_in_milliseconds_never_zero() -> None:
    assert grpc.timeout_value(1.2345) == b"1234m"
    assert grpc.timeout_value(-3) == b"1m"  # already past: the sandbox refuses it at once
    assert grpc.timeout_value(1e9) == b"99999999m"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (404, grpc.UNIMPLEMENTED),
        (503, grpc.UNAVAILABLE),
        (502, grpc.UNAVAILABLE),
        (504, grpc.DEADLINE_EXCEEDED),
        (408, grpc.DEADLINE_EXCEEDED),
        (400, grpc.INTERNAL),
        (431, grpc.RESOURCE_EXHAUSTED),
        (500, grpc.UNKNOWN),
    ],
)
def test_code_for(status: int, code: int) -> None:
    assert grpc.code_for(status) == code


def test_an_error_message_is_percent_encoded() -> None:
    fields = dict(grpc.error_head(14, "no capacity: app 'shop' 100% busy\nretry"))
    assert fields[b"grpc-status"] == b"14"
    assert fields[b"grpc-message"] == b"no capacity: app 'shop' 100%25 busy%0Aretry"
    assert fields[b"content-type"] == b"application/grpc"


@pytest.mark.parametrize(
    ("content_type", "call"),
    [
        (b"application/grpc", True),
        (b"application/grpc+proto", True),
        (b"application/grpc;charset=utf-8", True),
        (b"application/grpc-web", False),  # gRPC-Web is HTTP/1.1's: not passed as a call
        (b"application/json", False),
        (None, False),
    ],
)
def test_is_call(content_type: bytes | None, call: bool) -> None:
    assert grpc.is_call(content_type) is call


OK_HEAD = [(b"content-type", b"application/grpc")]
"""The head of an answer whose status comes in its trailers."""


@pytest.mark.parametrize(
    ("head", "trailers", "status"),
    [
        (OK_HEAD, [(b"grpc-status", b"0")], 0),
        (OK_HEAD, [(b"grpc-message", b"gone"), (b"grpc-status", b"14")], 14),
        ([*OK_HEAD, (b"grpc-status", b"5")], [], 5),  # trailers-only: the head holds it
        ([(b"grpc-status", b"5")], [(b"grpc-status", b"13")], 13),  # the last block's
        ([(b"grpc-status", b"5")], [(b"grpc-message", b"x")], None),  # not the head's then
        (OK_HEAD, [], None),
        ([], [], None),
        (OK_HEAD, [(b"grpc-status", b" 7 ")], 7),
        (OK_HEAD, [(b"grpc-status", b"16")], 16),
        (OK_HEAD, [(b"grpc-status", b"17")], 17),  # gRPC names none past 16: kept as given
        (OK_HEAD, [(b"grpc-status", b"99")], 99),
        (OK_HEAD, [(b"grpc-status", b"100")], None),  # past MAX_CODE
        (OK_HEAD, [(b"grpc-status", b"-1")], None),
        (OK_HEAD, [(b"grpc-status", b"+1")], None),
        (OK_HEAD, [(b"grpc-status", b"1.0")], None),
        (OK_HEAD, [(b"grpc-status", b"OK")], None),
        (OK_HEAD, [(b"grpc-status", b"")], None),
        (OK_HEAD, [(b"grpc-status", "\u0663".encode())], None),  # a digit, not an ASCII one
        (OK_HEAD, [(b"grpc-status", b"1"), (b"grpc-status", b"2")], 1),  # the first
    ],
)
def test_status_of(
    head: list[tuple[bytes, bytes]], trailers: list[tuple[bytes, bytes]], status: int | None
) -> None:
    assert grpc.status_of(head, trailers) == status


@pytest.mark.parametrize(
    ("http_status", "head", "trailers", "code"),
    [
        (200, OK_HEAD, [(b"grpc-status", b"0")], grpc.OK),
        (200, OK_HEAD, [(b"grpc-status", b"14")], grpc.UNAVAILABLE),
        (200, [(b"grpc-status", b"12")], [], grpc.UNIMPLEMENTED),
        (499, OK_HEAD, [(b"grpc-status", b"0")], grpc.CANCELLED),  # the client left first
        (499, [], [], grpc.CANCELLED),
        (404, [], [], grpc.UNIMPLEMENTED),  # the ingress's own answers: the code it sent
        (503, [], [], grpc.UNAVAILABLE),
        (504, [], [], grpc.DEADLINE_EXCEEDED),
        (502, OK_HEAD, [], grpc.UNAVAILABLE),  # cut off mid-answer
        (200, OK_HEAD, [], grpc.UNKNOWN),  # no status: what the client reads
        (200, OK_HEAD, [(b"grpc-status", b"x")], grpc.UNKNOWN),
        (503, [(b"grpc-status", b"8")], [], grpc.RESOURCE_EXHAUSTED),  # the sandbox's says
        (500, [], [], grpc.UNKNOWN),
    ],
)
def test_call_code(
    http_status: int,
    head: list[tuple[bytes, bytes]],
    trailers: list[tuple[bytes, bytes]],
    code: int,
) -> None:
    assert grpc.call_code(http_status, head, trailers) == code


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (0, "OK"),
        (1, "CANCELLED"),
        (4, "DEADLINE_EXCEEDED"),
        (12, "UNIMPLEMENTED"),
        (14, "UNAVAILABLE"),
        (16, "UNAUTHENTICATED"),
        (17, "17"),
        (99, "99"),
    ],
)
def test_code_name(code: int, name: str) -> None:
    assert code_name(code) == name
    if code <= 16:  # the constants the ingress answers with are gRPC's numbers
        assert getattr(grpc, name, code) == code


@pytest.mark.parametrize(
    ("value", "length"),
    [
        (b"0", 0),
        (b"42", 42),
        (b"007", 7),
        (b"9" * 18, 10**18 - 1),
        (b"1" + b"0" * 18, -1),  # 19 digits: past an int64's bound
        (b"9" * 5000, -1),  # never parsed (int() of it raised out of the connection once)
        (b"", -1),
        (b"+2", -1),
        (b"-1", -1),
        (b" 2", -1),
        (b"2,2", -1),
        (b"2_0", -1),
        ("\u0663".encode(), -1),  # a digit to str.isdigit, not to bytes.isdigit
    ],
)
def test_content_length(value: bytes, length: int) -> None:
    assert content_length(value) == length


@pytest.mark.parametrize(
    ("name", "value", "fit"),
    [
        (b"content-type", b"text/plain", True),
        (b"x-tab", b"a\tb", True),  # a tab is whitespace a value may hold
        (b"x-8bit", b"caf\xc3\xa9", True),  # obs-text: HTTP/1.1 carries it
        (b'x"(a)/b{}', b"v", False),  # not a token
        (b"x sp", b"v", False),
        (b"x-ctl", b"a\x01b", False),
        (b"x-esc", b"\x1b[31m", False),
        (b"x-del", b"a\x7f", False),
    ],
)
def test_fit_for_http1(name: bytes, value: bytes, fit: bool) -> None:
    assert fit_for_http1(name, value) is fit
