"""h2c to the sandboxes of an app with `protocol = "h2c"` (`upstream.h2c`), against a sandbox
written with h2 in the test (`tests.support.h2sandbox`): many requests share one connection;
a stream the sandbox refused, or left out of its GOAWAY, is sent again and answered; a reset
mid-answer, a head past the bound, a flood of PINGs and silence are 502/504 with the lease
given back; a client
that leaves resets its stream on the sandbox; an HTTP/1.1 client of an h2c app is served."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import httpx
import pytest
from hyperframe.frame import ContinuationFrame, DataFrame, GoAwayFrame, HeadersFrame, PingFrame

from tests.support.h2sandbox import H2Sandbox, ok
from tests.support.ingress import Stack, stack
from tests.support.waiting import eventually
from wakeful.aio.flow import HIGH_WATER
from wakeful.domain.models import AppSpec, Concurrency
from wakeful.ingress.errors import UpstreamFailed
from wakeful.ingress.http2.budgets import CONTROL_BURST
from wakeful.ingress.upstream.h2c import MAX_UNSENT, H2Pool, H2Upstream

pytestmark = pytest.mark.anyio

H2C = {
    "spec": AppSpec(
        command=["serve"],
        protocol="h2c",
        concurrency=Concurrency(requests_per_instance=100, max_instances=20),
    )
}
Conn = h2.connection.H2Connection


def h2_client(s: Stack) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=s.url, http1=False, http2=True, headers={"host": "hello.localhost"}, timeout=30
    )


async def settled(s: Stack) -> None:
    await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0, 5)


async def test_many_requests_share_one_connection() -> None:
    with H2Sandbox() as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s, h2_client(s) as client:
            answers = await asyncio.gather(*(client.get(f"/n/{i}") for i in range(40)))
            assert [a.text for a in answers] == [f"/n/{i}" for i in range(40)]
            plain = await s.client.get("/from-http11")  # an HTTP/1.1 client of an h2c app
            assert plain.status_code == 200 and plain.text == "/from-http11"
        assert sandbox.connections == 1
        head = sandbox.requests[0]
        assert head[b":authority"] == b"hello.localhost" and head[b"te"] == b"trailers"
        assert head[b":scheme"] == b"http" and b"x-request-id" in head


@pytest.mark.parametrize("how", ["refused", "goaway"])
async def test_a_stream_the_sandbox_never_processed_is_sent_again(how: str) -> None:
    first = itertools.count()

    def answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
        if next(first) == 0:
            if how == "refused":
                conn.reset_stream(stream, h2.errors.ErrorCodes.REFUSED_STREAM)
            else:
                conn.close_connection(last_stream_id=0)  # going away, this one not taken
            return
        ok(conn, stream, head, body)

    with H2Sandbox(answer) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            answer_ = await s.client.get("/again")
            assert answer_.status_code == 200 and answer_.text == "/again"
            await settled(s)
        assert len(sandbox.requests) == 2


def reset_mid_answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    conn.send_headers(stream, [(b":status", b"200")])
    conn.send_data(stream, b"part of it")
    conn.reset_stream(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)


def huge_head(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """70 KB of head, past the 64 KiB bound (hpack takes a while to encode it: ~0.5 s)."""
    conn.send_headers(stream, [(b":status", b"200"), (b"x-big", b"b" * 70_000)])


def silent(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    return


def ping_flood(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> bytes:
    """Past the control-frame budget in PINGs (each one h2 would parse and acknowledge,
    ~7 µs of the loop every app shares), then a good answer."""
    ok(conn, stream, head, body)
    return PingFrame(0, opaque_data=b"12345678").serialize() * (CONTROL_BURST + 500)


def early_hints_flood(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """1xx heads past the control-frame budget, then a good answer: each one decoded and
    skipped, and nothing else bounded them (h2 took them without end too)."""
    for _ in range(CONTROL_BURST + 100):
        conn.send_headers(stream, [(b":status", b"103")])
    ok(conn, stream, head, body)


def empty_continuations(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> bytes:
    """A head left open, then CONTINUATION frames with nothing in them past the control
    budget: no bytes, so the head's bound never counted them (h2 refused the 65th)."""
    block = conn.encoder.encode([(b":status", b"200")])
    opened = HeadersFrame(stream, block).serialize()  # no END_HEADERS
    pending = conn.data_to_send()  # h2's own frames first: none may cut into the block
    return pending + opened + ContinuationFrame(stream, b"").serialize() * (CONTROL_BURST + 100)


def status_of(value: bytes) -> Callable[[Conn, int, dict[bytes, bytes], bytes], None]:
    def answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
        conn.send_headers(stream, [(b":status", value)], end_stream=True)

    return answer


@pytest.mark.parametrize(
    ("answer", "status", "silence"),
    [
        (huge_head, 502, 30),
        (silent, 504, 0.5),
        (ping_flood, 502, 30),
        (early_hints_flood, 502, 30),
        (empty_continuations, 502, 30),
        *((status_of(v), 502, 30) for v in (b"-1", b"0", b"+200", b"2_00", b"600", b"9" * 20)),
    ],
    ids=[
        "huge-head",
        "silent",
        "PING flood",
        "1xx flood",
        "empty CONTINUATION flood",
        *(f":status {v}" for v in ("-1", "0", "+200", "2_00", "600", "9x20")),
    ],
)
async def test_a_sandbox_that_misbehaves_before_its_answer_gets_an_error_answer(
    answer: object, status: int, silence: float
) -> None:
    with H2Sandbox(answer) as sandbox:  # type: ignore[arg-type]
        async with stack({"s1": sandbox.port}, pool_update=H2C, request_timeout=silence) as s:
            got = await s.client.get("/")
            assert got.status_code == status, got.text
            await settled(s)
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
        assert len(sandbox.requests) == 1  # it answered (badly) or took it: never sent again


async def test_a_reset_mid_answer_cuts_the_client_off_and_gives_the_lease_back() -> None:
    with H2Sandbox(reset_mid_answer) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s, h2_client(s) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get("/")
            await settled(s)
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 1


def reset_after_head(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    conn.send_headers(stream, [(b":status", b"200")])
    conn.reset_stream(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)


def short_head_only(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """A length of 5 on a HEADERS frame that ends the stream: h2 holds only DATA to it."""
    conn.send_headers(stream, [(b":status", b"200"), (b"content-length", b"5")], end_stream=True)


@pytest.mark.parametrize("http2", [False, True], ids=["HTTP/1.1", "HTTP/2"])
@pytest.mark.parametrize("answer", [reset_after_head, short_head_only], ids=["reset", "short"])
async def test_an_answer_that_fails_before_any_of_it_went_is_a_502(
    answer: object, http2: bool
) -> None:
    """The head is held until the body's first bytes: a reset in the same read as the head,
    or an answer its HEADERS end short of its Content-Length (an HTTP/2 client got a whole,
    empty 200: a hostile tester's find), leaves nothing sent, and the client gets a 502."""
    with H2Sandbox(answer) as sandbox:  # type: ignore[arg-type]
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s, h2_client(s) as h2:
            got = await (h2 if http2 else s.client).get("/")
            assert got.status_code == 502, got.text
            await settled(s)
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 1
        assert len(sandbox.requests) == 1  # taken: never sent again


async def test_a_client_that_leaves_resets_its_stream_on_the_sandbox() -> None:
    with H2Sandbox(silent) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            with pytest.raises(httpx.ReadTimeout):
                await s.client.get("/", timeout=0.3)
            await settled(s)
            await eventually(lambda: sandbox.resets == [h2.errors.ErrorCodes.CANCEL], 5)


def goaway_then_answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> bytes:
    """A sandbox stopping gracefully: GOAWAY naming this stream, then its answer."""
    ok(conn, stream, head, body)
    return GoAwayFrame(0, last_stream_id=stream, error_code=0).serialize()


async def test_a_sandbox_going_away_still_answers_the_streams_it_named() -> None:
    """h2 takes no frame after a GOAWAY: the ingress keeps the sandbox's from it, so the
    answer that follows arrives (as grpcio's `server.stop(grace)` sends them)."""
    with H2Sandbox(goaway_then_answer) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            first = await s.client.get("/named")
            assert first.status_code == 200 and first.text == "/named"
            second = await s.client.get("/next")  # on a new connection: the old one went
            assert second.status_code == 200 and second.text == "/next"
        assert sandbox.connections == 2


class Recorder(asyncio.Transport):
    """asyncio's transport interface, keeping what is written (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def take(self) -> bytes:
        data, self.written = bytes(self.written), bytearray()
        return data

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return

    def get_write_buffer_size(self) -> int:
        return 0  # every write goes out at once

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a"), (b":path", b"/")]
POST = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"a"), (b":path", b"/")]
"""Request heads for the connection in memory (`in_memory`)."""


async def in_memory() -> tuple[Conn, H2Upstream, Recorder]:
    """An h2c connection of the ingress to a sandbox speaking h2 in memory (no socket), past
    its preface and settings: (the sandbox, the connection, what it writes)."""
    sandbox = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    sandbox.initiate_connection()
    conn = H2Upstream(H2Pool(keepalive=5))
    wire = Recorder()
    conn.connection_made(wire)
    conn.data_received(sandbox.data_to_send())
    await asyncio.sleep(0)  # the ingress writes once a turn of the loop
    sandbox.receive_data(wire.take())
    return sandbox, conn, wire


async def test_answers_nobody_reads_give_the_shared_window_back() -> None:
    """100 answers of 200 KiB on one connection, each closed unread (its client left): 20 MB,
    past the connection's 16 MiB window. Each close acknowledges what it drops, so the
    sandbox's window toward the ingress never shrinks (it would, for good, and every stream
    on the connection would stall). A sandbox speaking h2 in memory, no socket."""
    sandbox, conn, wire = await in_memory()
    full = sandbox.outbound_flow_control_window
    for _ in range(100):
        exchange = conn.open(GET, None, 5.0)
        await asyncio.sleep(0)
        sandbox.receive_data(wire.take())
        sandbox.send_headers(exchange.stream_id, [(b":status", b"200")])
        for _ in range(12):
            sandbox.send_data(exchange.stream_id, b"b" * 16384)
        sandbox.send_data(exchange.stream_id, b"b" * 8192)
        conn.data_received(sandbox.data_to_send())
        exchange.close()  # nothing of it read
        await asyncio.sleep(0)
        sandbox.receive_data(wire.take())
    # h2 sends a WINDOW_UPDATE once half the window is acknowledged: never less than half.
    assert sandbox.outbound_flow_control_window >= full // 2


async def test_answers_past_their_length_give_the_shared_window_back() -> None:
    """100 answers whose DATA runs past their Content-Length, 1.6 MB: each is its stream's
    error, and the bytes refused are read all the same, so the sandbox's window toward the
    ingress never shrinks (it did, for good, until every call on the connection stalled: a
    hostile tester's find). A sandbox speaking h2 in memory, no socket."""
    sandbox, conn, wire = await in_memory()
    full = sandbox.outbound_flow_control_window
    for _ in range(100):
        exchange = conn.open(GET, None, 5.0)
        await asyncio.sleep(0)
        sandbox.receive_data(wire.take())
        sandbox.send_headers(exchange.stream_id, [(b":status", b"200"), (b"content-length", b"2")])
        sandbox.send_data(exchange.stream_id, b"b" * 16_000)
        conn.data_received(sandbox.data_to_send())
        with pytest.raises(UpstreamFailed, match="for a content-length of 2"):
            await exchange.next()
        exchange.close()
        await asyncio.sleep(0)
        sandbox.receive_data(wire.take())
    assert sandbox.outbound_flow_control_window >= full // 2
    window = conn._wire.inbound  # every byte counted as read: acknowledged, or soon
    assert window.current + window.processed == 16 * 1024 * 1024
    assert not conn.exchanges and not conn._wire.streams and not conn.closed


class Unread(Recorder):
    """A transport whose peer reads nothing: every write stays in its buffer, and past
    `HIGH_WATER` the protocol is told to pause writing (as uvloop's, so limited)."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        super().write(data)
        if len(self.written) > HIGH_WATER and not self.paused:
            self.paused = True
            self.protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.written)


async def test_a_sandbox_that_reads_nothing_of_the_resets_it_provokes_is_cut() -> None:
    """DATA frames on a closed stream, each answered with RST_STREAM, from a sandbox that
    reads none of it: no budget counts them (the windows bound their bytes, not their
    number), so the ingress's buffer grew without end. Past `MAX_UNSENT` unread, the
    connection is cut. A sandbox speaking h2 in memory, no socket."""
    sandbox, conn, _ = await in_memory()
    unread = Unread(conn)
    conn.transport = unread
    exchange = conn.open(GET, None, 5.0)
    kept = conn.open(GET, None, 5.0)  # another call keeps the connection in use
    sandbox.receive_data(Recorder.take(unread))
    await asyncio.sleep(0)
    sandbox.receive_data(Recorder.take(unread))
    sandbox.send_headers(exchange.stream_id, [(b":status", b"200")], end_stream=True)
    conn.data_received(sandbox.data_to_send())
    exchange.close()
    await asyncio.sleep(0)
    late = DataFrame(exchange.stream_id, b"x").serialize() * 10_000
    for _ in range(100):  # 1 MB of them, 13 bytes of RST_STREAM each
        conn.data_received(late)
        await asyncio.sleep(0)
        if conn.closed:
            break
    assert conn.closed and unread.closed
    assert len(unread.written) < MAX_UNSENT + 2 * 13 * 10_000
    with pytest.raises(UpstreamFailed, match="unread"):
        await kept.next()


async def test_an_answer_ended_short_is_refused_whole_and_its_bytes_read_once() -> None:
    """A DATA frame that ends its stream short of the Content-Length is refused before it is
    taken (else the connection acknowledged its bytes twice: once as refused, once read),
    and one whose HEADERS end it short before its head is (a reviewer's finds)."""
    sandbox, conn, wire = await in_memory()
    for how in ("data", "head"):
        exchange = conn.open(GET, None, 5.0)
        await asyncio.sleep(0)
        sandbox.receive_data(wire.take())
        fields = [(b":status", b"200"), (b"content-length", b"100000")]
        sandbox.send_headers(exchange.stream_id, fields, end_stream=how == "head")
        if how == "data":
            sandbox.send_data(exchange.stream_id, b"b" * 16_000, end_stream=True)
        conn.data_received(sandbox.data_to_send())
        if how == "head":
            with pytest.raises(UpstreamFailed, match="content-length of 100000"):
                await exchange.wait_head(5.0)
        else:
            await exchange.wait_head(5.0)
            with pytest.raises(UpstreamFailed, match="content-length of 100000"):
                await exchange.next()
        assert exchange.drop_unread() == 0  # nothing of it taken
        exchange.close()
    window = conn._wire.inbound
    assert window.current + window.processed == 16 * 1024 * 1024


async def test_uploads_that_burst_together_are_not_taken_for_a_sandbox_that_reads_nothing() -> None:
    """64 calls whose bodies are all there at once, to a sandbox whose windows grew to 16 MiB
    (grpc-go's and tonic's bandwidth probes do) and whose socket is full for a moment: the
    writers of a turn queue at most `HIGH_WATER` before the write gate closes, so their
    bytes never reach `MAX_UNSENT` (4 MiB in one write cut a healthy sandbox off: a
    reviewer's find)."""
    sandbox, conn, wire = await in_memory()
    sandbox.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    sandbox.increment_flow_control_window(16 * 1024 * 1024)
    conn.data_received(sandbox.data_to_send())
    await asyncio.sleep(0)
    sandbox.receive_data(wire.take())
    unread = Unread(conn)
    conn.transport = unread

    async def body() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"u" * 16384

    for _ in range(64):
        conn.open(POST, body(), 30.0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not conn.closed
    assert 0 < len(unread.written) < 2 * HIGH_WATER


async def test_an_answer_in_the_turn_its_deadline_passes_is_taken() -> None:
    """The head read in the same turn of the loop as the deadline's timer, just before it:
    the wait it ended is over, so the timer fails nothing (it failed the call mid-body)."""
    sandbox, conn, wire = await in_memory()
    exchange = conn.open(GET, None, 5.0)
    await asyncio.sleep(0)
    sandbox.receive_data(wire.take())
    waiting = asyncio.ensure_future(exchange.wait_head(0.05))
    await asyncio.sleep(0)
    sandbox.send_headers(exchange.stream_id, [(b":status", b"200")])
    loop = asyncio.get_running_loop()
    loop.call_at(exchange._silence._armed - 1e-9, conn.data_received, sandbox.data_to_send())
    await waiting
    await asyncio.sleep(0.1)
    assert exchange._error is None and exchange.status == 200
    exchange.close()


async def test_a_sandbox_that_pings_for_each_frame_it_is_sent_keeps_its_connection() -> None:
    """grpc-go's server answers each DATA frame it gets with a PING while it measures the
    bandwidth, so a long upload brings as many PINGs as DATA frames: what the ingress sends
    earns the sandbox's budget, and such a sandbox is not cut off (a PING flood unearned
    is, above). A sandbox speaking h2 in memory, no socket."""
    sandbox, conn, wire = await in_memory()
    frames = CONTROL_BURST + 500

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(frames):
            yield b"x"  # a DATA frame each

    conn.open(POST, upload(), 5.0)
    for _ in range(5):
        await asyncio.sleep(0)
    sandbox.receive_data(wire.take())
    conn.data_received(PingFrame(0, opaque_data=b"12345678").serialize() * frames)
    assert not conn.closed


def half_then_silent(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    conn.send_headers(stream, [(b":status", b"200")])
    conn.send_data(stream, b"half")


async def test_a_stream_the_ingress_times_out_is_reset_on_the_sandbox() -> None:
    with H2Sandbox(half_then_silent) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C, request_timeout=0.3) as s:
            with pytest.raises(httpx.RemoteProtocolError):
                await s.client.get("/")
            await settled(s)
            await eventually(lambda: sandbox.resets == [h2.errors.ErrorCodes.CANCEL], 5)


def unfit_for_http1(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """Fields HTTP/2 carries and HTTP/1.1 does not: a name that is no token, a value with
    controls, a Content-Length twice."""
    fields = [(b":status", b"200"), (b'x"(a)/b{}', b"v"), (b"x-ctl", b"a\x01\x0b\x1bb")]
    conn.send_headers(stream, [*fields, (b"content-length", b"2"), (b"content-length", b"2")])
    conn.send_data(stream, b"ok", end_stream=True)


async def test_an_h2c_answer_reaches_an_http11_client_as_valid_http11() -> None:
    """h2 refuses only NUL, CR and LF in a field: the rest went on to HTTP/1.1 clients as
    sent, and strict ones (llhttp) refused the whole answer (a hostile tester's find)."""
    with H2Sandbox(unfit_for_http1) as sandbox:  # type: ignore[arg-type]
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            reader, writer = await asyncio.open_connection(*s.ingress.address)
            writer.write(b"GET / HTTP/1.1\r\nHost: hello.localhost\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"ok", answer
    assert b"x-ctl" not in head and b'x"(a)' not in head, head
    assert head.count(b"content-length") == 1, head


def _raw_head(conn: Conn, stream: int, fields: list[tuple[bytes, bytes]], end: bool) -> bytes:
    """A HEADERS frame h2 would refuse to send, coded with the connection's own encoder (its
    table stays in step)."""
    flags = {"END_HEADERS", "END_STREAM"} if end else {"END_HEADERS"}
    return HeadersFrame(stream, conn.encoder.encode(fields), flags=flags).serialize()


def malformed_when_bad(
    how: str,
) -> Callable[[Conn, int, dict[bytes, bytes], bytes], bytes | None]:
    """`ok` for every path but /bad, which gets an answer that breaks HTTP/2's rules."""

    def answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> bytes | None:
        if head[b":path"] != b"/bad":
            ok(conn, stream, head, body)
            return None
        # (the stream left open: the reset that answers it is seen)
        if how == "upper-case name":
            return _raw_head(conn, stream, [(b":status", b"200"), (b"X-Up", b"v")], False)
        if how == "request pseudo-field":
            return _raw_head(conn, stream, [(b":status", b"200"), (b":path", b"/")], False)
        if how == "no :status":
            return _raw_head(conn, stream, [(b"content-type", b"text/plain")], False)
        if how == "DATA before its head":
            return DataFrame(stream, b"early").serialize()
        if how == "body past its length":
            conn.send_headers(stream, [(b":status", b"200"), (b"content-length", b"2")])
            conn.send_data(stream, b"too long")
        elif how == "body short of its length":
            conn.send_headers(stream, [(b":status", b"200"), (b"content-length", b"20")])
            conn.send_data(stream, b"short", end_stream=True)
        elif how == "1xx ending its stream":
            return _raw_head(conn, stream, [(b":status", b"103")], True)
        elif how == "malformed 1xx":
            return _raw_head(conn, stream, [(b":status", b"103"), (b"connection", b"x")], False)
        elif how == "pseudo-field in trailers":  # all of it raw: written before h2's bytes
            head = _raw_head(conn, stream, [(b":status", b"200")], False)
            body = DataFrame(stream, b"body").serialize()
            trailers = [(b":status", b"200"), (b"grpc-status", b"0")]
            return head + body + _raw_head(conn, stream, trailers, True)
        return None

    return answer


@pytest.mark.parametrize(
    "how",
    [
        "upper-case name",
        "request pseudo-field",
        "no :status",
        "DATA before its head",
        "body past its length",
        "body short of its length",
        "1xx ending its stream",
        "malformed 1xx",
        "pseudo-field in trailers",
    ],
)
async def test_a_malformed_answer_fails_its_own_stream_and_no_other(how: str) -> None:
    """RFC 9113 §8.1.1: a malformed answer is its stream's error. The ingress resets that
    stream and answers 502 (or cuts its client off, once the head went), the calls sharing
    the connection are answered, and the connection stays (h2 ended it for each)."""
    with H2Sandbox(malformed_when_bad(how)) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s, h2_client(s) as client:
            first = await client.get("/first")  # the connection, open
            assert first.status_code == 200
            try:
                bad = (await client.get("/bad")).status_code
            except httpx.RemoteProtocolError:  # the head went before the body broke it
                bad = 0
            good = await client.get("/good")
            assert bad in (502, 0) and good.status_code == 200 and good.text == "/good"
            ended = how in ("body short of its length", "pseudo-field in trailers")
            assert bad == 502 or ended  # (their bytes may have gone before their end)
            await settled(s)
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 1
        assert sandbox.connections == 1  # nothing left to reset once ended:
        assert sandbox.resets == ([] if ended else [h2.errors.ErrorCodes.PROTOCOL_ERROR])


def informational_then(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """A 103 (Early Hints) first, then the answer; HEAD, 204 and 304 declare a length and
    have no body (RFC 9113 §8.1.1)."""
    conn.send_headers(stream, [(b":status", b"103"), (b"link", b"</a.css>; rel=preload")])
    if head[b":method"] == b"HEAD" or head[b":path"] in (b"/304", b"/204"):
        status = head[b":path"][1:] if head[b":path"] != b"/" else b"200"
        conn.send_headers(stream, [(b":status", status), (b"content-length", b"5")], True)
        return
    conn.send_headers(stream, [(b":status", b"200"), (b"content-length", b"5")])
    conn.send_data(stream, b"hello", end_stream=True)


async def test_1xx_heads_are_skipped_and_answers_without_a_body_keep_their_length() -> None:
    with H2Sandbox(informational_then) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            got = await s.client.get("/")
            assert got.status_code == 200 and got.text == "hello"
            head = await s.client.head("/")
            assert head.status_code == 200 and head.headers["content-length"] == "5"
            unchanged = await s.client.get("/304")
            assert unchanged.status_code == 304 and unchanged.content == b""
            empty = await s.client.get("/204")
            assert empty.status_code == 204 and empty.content == b""
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 0
        assert sandbox.connections == 1


async def test_a_call_past_its_maximum_duration_is_ended_and_reset_on_the_sandbox() -> None:
    """A gRPC call's stream lasts at most the app's maximum (`WAKEFUL_WEBSOCKET_MAX_DURATION`),
    busy or silent: past it the sandbox's stream is reset and the client's call ends."""
    with H2Sandbox(half_then_silent) as sandbox:
        async with (
            stack({"s1": sandbox.port}, pool_update=H2C, websocket_max_duration=0.5) as s,
            h2_client(s) as client,
        ):
            started = asyncio.get_running_loop().time()
            with pytest.raises(httpx.RemoteProtocolError):  # its stream reset mid-answer
                await client.post(
                    "/svc/Long", headers={"content-type": "application/grpc"}, content=b"\0" * 5
                )
            took = asyncio.get_running_loop().time() - started
            assert 0.4 < took < 10, took
            await settled(s)
            await eventually(lambda: sandbox.resets == [h2.errors.ErrorCodes.CANCEL], 5)


def answer_early(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """The whole answer as soon as the request's head came, its body not read."""
    conn.send_headers(stream, [(b":status", b"200"), (b"content-length", b"5")])
    conn.send_data(stream, b"early", end_stream=True)


async def test_an_answer_before_the_request_s_body_ends_resets_the_stream() -> None:
    """RFC 9113 §8.1: a server may answer whole before the request's body is in. The client
    gets the answer, and the stream, still open on the ingress's side, is reset when the
    exchange closes (with h2 it stayed open for the connection's life)."""
    with H2Sandbox(answer_early, on_head=True) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            reader, writer = await asyncio.open_connection(*s.ingress.address)
            client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            client.initiate_connection()
            head = [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "hello.localhost"),
                (":path", "/svc/Upload"),
                ("content-type", "application/grpc"),
            ]
            client.send_headers(1, head)
            client.send_data(1, b"\0\0\0\0\x05first")  # and the rest never comes
            writer.write(client.data_to_send())
            body = b""
            ended = False
            while not ended:
                data = await asyncio.wait_for(reader.read(65536), 10)
                assert data, body
                for event in client.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        body += event.data
                    ended = ended or isinstance(event, h2.events.StreamEnded)
                writer.write(client.data_to_send())
            assert body == b"early"
            writer.close()
            await settled(s)
            await eventually(lambda: sandbox.resets == [h2.errors.ErrorCodes.CANCEL], 5)
