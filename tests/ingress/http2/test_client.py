"""`http2.client` held to `h2`'s client (which `upstream.h2c` used before), as `http2.wire`
is held to `h2`'s server (`test_wire`): the same events and the same bytes out over
conversations with `h2`'s own server, the same verdict over hostile frame sequences from a
sandbox, but for the departures the module names (each tested on its own at the end)."""

from __future__ import annotations

import random

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
import pytest

from tests.support.h2ref import (
    Compared,
    Norm,
    SmallHuffman,
    fit,
    reset_here,
    verdicts,
)
from wakeful.ingress.http2 import client, frames, streams, wire

MAX_HEAD = 32 * 1024
WINDOW = 256 * 1024
ANSWER = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def reference() -> h2.connection.H2Connection:
    """`h2`'s client as `upstream.h2c` configured it, less its checks of an answer's fields
    (now `rules.malformed_answer`, held to `h2` in test_malformed)."""
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config)
    conn.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEAD,
        },
    )
    fit(conn, MAX_HEAD)
    return conn


class Pair(Compared):
    """`h2`'s client and ours, fed alike."""

    def __init__(self) -> None:
        self.ref = reference()
        self.new = client.ClientWire(MAX_HEAD, WINDOW)
        for conn in (self.ref, self.new):
            conn.initiate_connection()
            conn.increment_flow_control_window(1024 * 1024 - 65_535)
        self.first = self.same_out()

    def open(self, headers: list[tuple[bytes, bytes]], ended: bool) -> int:
        stream_id = self.ref.get_next_available_stream_id()
        self.ref.send_headers(stream_id, headers, end_stream=ended)
        assert self.new.open(headers, ended) == stream_id
        return stream_id


def _head(rng: random.Random) -> list[tuple[bytes, bytes]]:
    """A request as `upstream.h2c.request_headers` makes one."""
    return [
        (b":method", rng.choice((b"GET", b"POST", b"HEAD"))),
        (b":scheme", b"http"),
        (b":authority", b"hello.localhost"),
        (b":path", f"/svc/{rng.randint(0, 999)}".encode()),
        (b"x-request-id", rng.randbytes(8).hex().encode()),
        (b"authorization", b"Bearer t"),
        (b"x-pad", b"v" * rng.choice((1, 100, 20_000))),
        (b"te", b"trailers"),
    ]


def _converse(seed: int) -> int:
    """A random conversation between `h2`'s server and both clients; how many requests."""
    rng = random.Random(seed)
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.encoder = SmallHuffman()
    server.initiate_connection()
    pair = Pair()
    server.receive_data(pair.first)
    answering: dict[int, int] = {}
    requests = 0

    def deliver(data: bytes) -> None:
        at = 0
        while at < len(data):
            step = rng.choice((1, 9, 50, 4096, len(data)))
            for event in pair.receive(data[at : at + step]):
                if event[0] == wire.BODY and event[3] and rng.random() < 0.8:
                    pair.ref.acknowledge_received_data(event[3], event[1])
                    pair.new.acknowledge(event[3], event[1])
            at += step
        back = pair.same_out()
        if back:
            try:
                for event in server.receive_data(back):
                    if isinstance(event, h2.events.RequestReceived):
                        head = dict(event.headers)  # type: ignore[arg-type]
                        sizes = (0,) if head[b":method"] == b"HEAD" else (0, 10, 5000, 100_000)
                        answering[event.stream_id] = rng.choice(sizes)
            except h2.exceptions.ProtocolError:  # its GOAWAY: `upstream.h2c` reads that
                over.append(seed)

    over: list[int] = []
    if rng.random() < 0.7:
        deliver(server.data_to_send())
    for _ in range(rng.randint(5, 40)):
        roll = rng.random()
        try:
            if roll < 0.05:
                server.update_settings(
                    {
                        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: rng.choice(
                            (0, 100, 65_535, 2**20)
                        ),
                        h2.settings.SettingCodes.MAX_FRAME_SIZE: rng.choice((16_384, 20_000)),
                        h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: rng.choice((2, 100)),
                        h2.settings.SettingCodes.HEADER_TABLE_SIZE: rng.choice((0, 100, 4096)),
                    }
                )
            elif roll < 0.3:
                try:
                    pair.open(_head(rng), rng.random() < 0.5)
                    requests += 1
                except (h2.exceptions.TooManyStreamsError, streams.CannotSend):
                    assert pair.new.room() <= 0
            elif roll < 0.45:
                _send_body(rng, pair)
            elif roll < 0.5 and pair.new.streams:
                stream_id = rng.choice(sorted(pair.new.streams))
                pair.ref.reset_stream(stream_id, 8)
                pair.new.reset_stream(stream_id, 8)
            elif roll < 0.55:
                server.ping(rng.randbytes(8))
            elif roll < 0.6 and server.streams:
                server.increment_flow_control_window(rng.randint(1, 70_000))
            else:
                for stream_id, left in list(answering.items()):
                    _answer(rng, server, stream_id, left, answering)
        except h2.exceptions.StreamClosedError:
            pass
        try:
            deliver(server.data_to_send())
        except h2.exceptions.ProtocolError:  # both clients ended the connection, alike
            break
        pair.same_out()
        if over:
            break
    return requests


def _send_body(rng: random.Random, pair: Pair) -> None:
    open_ids = [s for s, st in pair.new.streams.items() if st.local_open]
    if not open_ids:
        return
    stream_id = rng.choice(open_ids)
    window = pair.ref.local_flow_control_window(stream_id)
    assert pair.new.local_flow_control_window(stream_id) == window
    size = min(rng.choice((0, 1, 1000, 16_384)), window, pair.ref.max_outbound_frame_size)
    if rng.random() < 0.3:
        pair.ref.end_stream(stream_id)
        pair.new.end_stream(stream_id)
    elif size:
        pair.ref.send_data(stream_id, b"d" * size)
        pair.new.send_data(stream_id, b"d" * size)


def _answer(
    rng: random.Random,
    server: h2.connection.H2Connection,
    stream_id: int,
    left: int,
    answering: dict[int, int],
) -> None:
    stream = server.streams.get(stream_id)
    if stream is None or stream.closed:
        del answering[stream_id]
        return
    roll = rng.random()
    if roll < 0.08:
        server.reset_stream(stream_id, rng.choice((7, 8, 2)))
        del answering[stream_id]
        return
    if not stream.state_machine.headers_sent:
        if roll < 0.2:
            server.send_headers(stream_id, [(b":status", b"100")])
        big = b"b" * rng.choice((1, 20_000))
        server.send_headers(stream_id, [*ANSWER, (b"x-big", big)], end_stream=left == 0)
        if left == 0:
            del answering[stream_id]
        return
    window = min(server.local_flow_control_window(stream_id), server.max_outbound_frame_size)
    chunk = min(left, window, rng.choice((1, 1000, 16_384, 100_000)))
    last = chunk == left
    if chunk:
        pad = rng.choice((None, None, 0, 10)) if chunk + 11 <= window else None
        server.send_data(stream_id, b"x" * chunk, end_stream=last and roll < 0.5, pad_length=pad)
    if last:
        if roll >= 0.5 or not chunk:
            server.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)
        del answering[stream_id]
    else:
        answering[stream_id] = left - chunk


def test_conversations_with_h2s_server_make_the_same_events_and_bytes_as_h2s_client() -> None:
    requests = sum(_converse(seed) for seed in range(300))
    assert requests > 1200


# -- hostile frame sequences from a sandbox ------------------------------------------------


def _hostile(rng: random.Random, encoder: hpack.Encoder, opened: int) -> bytes:
    """One frame a sandbox might send, valid or not: each field drawn from what breaks a rule
    and what does not (the ids of streams opened, closed, never opened, and the sandbox's)."""
    kind = rng.choice((0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 6, 8, 8, 9, 9, 5, 0x10))
    ids = [0, 1, 2, opened, opened + 2, max(1, opened - 2), 2**31 - 1]
    stream_id = rng.choice(ids)
    flags = rng.choice((0, 1, 4, 5, 8, 9, 0x20, 0x24, 0x25, 0x2D, 0xFF))
    if kind in (1, 9, 5):
        fields = rng.choice(
            (
                ANSWER,
                ANSWER,
                [(b":status", b"100")],
                [(b":status", b"103")],
                [(b"grpc-status", b"0")],
            )
        )
        payload = encoder.encode(fields)
        if rng.random() < 0.1:
            payload = rng.randbytes(rng.randint(0, 10))
        if kind == 5:
            payload = (opened + 1).to_bytes(4, "big") + payload
        if kind == 1 and flags & 0x20:
            dep = stream_id if rng.random() < 0.3 else rng.choice(ids)
            payload = dep.to_bytes(4, "big") + bytes([rng.randrange(256)]) + payload
        if flags & 0x8:
            pad = rng.choice((0, 3, 255, len(payload), len(payload) + 1))
            payload = bytes([pad & 0xFF]) + payload + b"\0" * min(pad, 300)
    elif kind == 0:
        payload = b"d" * rng.choice((0, 1, 100, 16_384, 20_000))
        if flags & 0x8:
            pad = rng.choice((0, 3, 255, len(payload), len(payload) + 1))
            payload = bytes([pad & 0xFF]) + payload[: max(0, len(payload) - pad)] + b"\0" * pad
    elif kind == 2:
        dep = stream_id if rng.random() < 0.3 else rng.choice(ids)
        payload = (dep.to_bytes(4, "big") + b"\x10")[: rng.choice((5, 5, 5, 4, 6))]
    elif kind == 3:
        payload = rng.choice((0, 7, 8, 2)).to_bytes(4, "big")[: rng.choice((4, 4, 4, 3))]
    elif kind == 4:
        payload = b"".join(
            rng.choice((1, 2, 3, 4, 5, 6, 8, 0x99)).to_bytes(2, "big")
            + rng.choice((0, 1, 2, 100, 16_384, 70_000, 2**24, 2**31 - 1, 2**31)).to_bytes(4, "big")
            for _ in range(rng.randint(0, 3))
        )
    elif kind == 6:
        payload = b"p" * rng.choice((8, 8, 8, 7))
    elif kind == 8:
        payload = rng.choice((0, 1, 1000, 2**31 - 1)).to_bytes(4, "big")[: rng.choice((4, 4, 5))]
    else:
        payload = rng.randbytes(rng.randint(0, 20))
    return frames.frame(kind, flags, stream_id, payload)


def _excuse(
    data: bytes, ref: Norm, new: Norm, conn: client.ClientWire, was_open: bool, answered: bool
) -> str | None:
    """Which named departure a difference is, if one (`answered`: the frame's stream had its
    final head in `client` before it); then the server side's (`test_wire`)."""
    from tests.ingress.http2.test_wire import _excuse as servers

    kind = data[3]
    stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
    if kind == 4 and ref[0] == "ok" and new[0] == "error":
        codes = [data[at : at + 2] for at in range(9, len(data), 6)]
        if len(set(codes)) < len(codes):  # h2 reads the last of a setting given twice
            return "a setting given twice, one of them invalid"
    if kind == 1 and stream_id % 2 == 0 and new == ("error", frames.PROTOCOL_ERROR):
        return "a stream the sandbox opened"  # h2 took it as a request to the client
    if ref[0] != "error":
        return servers(data, ref, new, conn, was_open)
    stream_error = reset_here(new, stream_id, frames.PROTOCOL_ERROR)
    if kind == 0 and was_open and not answered and (stream_error or new[0] == "error"):
        return "DATA before the final head"  # or the frame's own fault, read first here
    if kind in (1, 9) and stream_error:  # a 1xx ending it or after the final head, trailers
        return "a head its stream's state refuses"  # without END_STREAM
    if kind == 1 and reset_here(new, stream_id, frames.STREAM_CLOSED):
        return "a head on a stream the sandbox ended"  # RFC 9113 §5.1: the stream's error
    if kind in (1, 9) and not was_open and stream_id < conn.next_stream_id and new[0] == "ok":
        rst = frames.frame(3, 0, stream_id, frames.STREAM_CLOSED.to_bytes(4, "big"))
        if new[2].endswith(rst):
            return "a head on a closed stream"
    return servers(data, ref, new, conn, was_open)


def test_hostile_frame_sequences_from_a_sandbox_get_h2s_verdict() -> None:
    """Streams opened, then frames each drawn to break one rule or none, fed one a read to
    `h2`'s client and ours: the same events and bytes while both accept, the same connection
    error when `h2` refuses, but for the named departures; ours raises nothing but WireError."""
    rng = random.Random(20261207)
    compared = excused = 0
    seen: dict[str, int] = {}
    for _ in range(3000):
        pair = Pair()
        encoder = hpack.Encoder()
        for _ in range(rng.randint(1, 3)):
            pair.open(_head(random.Random(1)), rng.random() < 0.5)
        pair.same_out()
        opened = pair.new.next_stream_id - 2
        sent = [frames.frame(4, 0, 0, b"")]
        if rng.random() < 0.7:
            sent.append(frames.frame(4, 1, 0, b""))
        if rng.random() < 0.7:
            sent.append(frames.frame(1, 4, 1, encoder.encode(ANSWER)))
        sent += [_hostile(rng, encoder, opened) for _ in range(rng.randint(1, 12))]
        ref, new = pair.ref, pair.new
        for data in sent:
            stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            answered = stream_id in new._answered
            was_open = stream_id in new.streams
            r, n = verdicts(ref, new, data)
            if r != n:
                why = _excuse(data, r, n, new, was_open, answered)
                assert why is not None, (
                    f"frame {data[:40].hex()}: h2 {r!r:.300}, ours {n!r:.300}; after "
                    + " ".join(f[:20].hex() for f in sent[: sent.index(data)])
                )
                seen[why] = seen.get(why, 0) + 1
                excused += 1
                break
            compared += 1
            if r[0] == "error":
                break
    assert compared > 9000, (compared, seen)
    assert excused < 1000, seen


# -- the departures, one by one --------------------------------------------------------------


def _opened(count: int = 1, answered: bool = False) -> tuple[client.ClientWire, hpack.Encoder]:
    """Our client with `count` GET streams open (their final heads in if `answered`), past
    the sandbox's SETTINGS; what it sent taken."""
    new = client.ClientWire(MAX_HEAD, WINDOW)
    new.initiate_connection()
    for _ in range(count):
        new.open(_head(random.Random(1)), True)
    encoder = hpack.Encoder()
    data = frames.frame(4, 0, 0, b"")
    if answered:
        for stream_id in range(1, 2 * count, 2):
            data += frames.frame(1, 4, stream_id, encoder.encode(ANSWER))
    assert all(e.kind != wire.RESET for e in new.receive(data))
    new.data_to_send()
    return new, encoder


def _rst(stream_id: int, code: int) -> bytes:
    return frames.frame(3, 0, stream_id, code.to_bytes(4, "big"))


def test_data_before_the_answer_is_its_streams_error_and_its_bytes_read() -> None:
    new, _ = _opened(2)
    start = new.inbound.current
    events = new.receive(frames.frame(0, 0, 1, b"d" * 100))
    assert [(e.kind, e.stream_id, e.remote, e.code) for e in events] == [
        (wire.RESET, 1, False, frames.PROTOCOL_ERROR)
    ]
    assert new.data_to_send() == _rst(1, frames.PROTOCOL_ERROR)
    assert new.inbound.current + new.inbound.processed == start  # counted, and given back
    assert 1 not in new.streams and 3 in new.streams and not new._answered


@pytest.mark.parametrize(
    ("fields", "end"),
    [
        ([(b":status", b"103")], True),  # a 1xx that ends its stream
        ([(b":status", b"103"), (b"connection", b"close")], False),  # a malformed one
        ([(b":status", b"103"), (b":path", b"/")], False),
    ],
    ids=["ending", "connection-specific", "request pseudo-field"],
)
def test_a_bad_1xx_head_is_its_streams_error(fields: list[tuple[bytes, bytes]], end: bool) -> None:
    new, encoder = _opened(2)
    flags = 4 | (1 if end else 0)
    events = new.receive(frames.frame(1, flags, 3, encoder.encode(fields)))
    assert [(e.kind, e.stream_id, e.code) for e in events] == [
        (wire.RESET, 3, frames.PROTOCOL_ERROR)
    ]
    assert new.data_to_send() == _rst(3, frames.PROTOCOL_ERROR) and 1 in new.streams


def test_1xx_heads_are_skipped_and_counted() -> None:
    new, encoder = _opened(1)
    early = frames.frame(1, 4, 1, encoder.encode([(b":status", b"103"), (b"link", b"</a>")]))
    assert new.receive(early * 3) == [] and new.take_stray() == 3
    events = new.receive(frames.frame(1, 5, 1, encoder.encode(ANSWER)))
    assert [(e.kind, e.ended) for e in events] == [(client.ANSWER, True)]
    assert not new.streams and not new._answered  # closed both ways: forgotten


def test_a_1xx_after_the_answer_is_its_streams_error() -> None:
    new, encoder = _opened(1, answered=True)
    events = new.receive(frames.frame(1, 4, 1, encoder.encode([(b":status", b"100")])))
    assert [(e.kind, e.code) for e in events] == [(wire.RESET, frames.PROTOCOL_ERROR)]


def test_a_head_on_a_stream_both_ends_closed_is_refused_and_counted() -> None:
    """h2 ended the connection (STREAM_CLOSED); RFC 9113 §5.1 lets a stream error do."""
    new, encoder = _opened(1)
    new.receive(frames.frame(1, 5, 1, encoder.encode(ANSWER)))  # our GET ended: closed
    assert not new.streams
    events = new.receive(frames.frame(1, 5, 1, encoder.encode(ANSWER)))
    assert events == [] and new.data_to_send() == _rst(1, frames.STREAM_CLOSED)
    assert new.take_stray() == 1


@pytest.mark.parametrize("stream_id", [3, 2, 99])
def test_a_head_on_a_stream_never_opened_ends_the_connection(stream_id: int) -> None:
    """One of ours not yet opened, or one the sandbox opened (it cannot push; h2 took an
    even one as a request made to it)."""
    new, encoder = _opened(1)
    with pytest.raises(wire.WireError) as refused:
        new.receive(frames.frame(1, 5, stream_id, encoder.encode(ANSWER)))
    assert refused.value.code == frames.PROTOCOL_ERROR


def test_a_sandbox_may_not_enable_push() -> None:
    new, _ = _opened(1)
    with pytest.raises(wire.WireError) as refused:
        new.receive(frames.frame(4, 0, 0, (2).to_bytes(2, "big") + (1).to_bytes(4, "big")))
    assert refused.value.code == frames.PROTOCOL_ERROR


def test_a_window_setting_given_many_times_moves_the_streams_once_to_its_last() -> None:
    """As h2 read it (the last value of each setting); once a frame, not once an entry: a
    SETTINGS frame of 2,730 entries over 64 open streams took 2.7 ms an entry-walk each (a
    hostile tester's find). A passing value past what a stream may hold is not applied."""
    pair = Pair()
    for _ in range(3):
        pair.open(_head(random.Random(2)), True)
    pair.same_out()
    entry = (4).to_bytes(2, "big")
    payload = entry + (2**31 - 1).to_bytes(4, "big")  # each stream past 2^31-1, if applied
    payload += (entry + (65_535).to_bytes(4, "big") + entry + (65_536).to_bytes(4, "big")) * 100
    pair.receive(frames.frame(8, 0, 1, (10).to_bytes(4, "big")) + frames.frame(4, 0, 0, payload))
    for stream_id in (1, 3, 5):
        assert pair.new.local_flow_control_window(stream_id) == min(
            pair.ref.local_flow_control_window(stream_id), 1024 * 1024
        )
    assert pair.new.streams[1].sent == 65_546 and pair.new.streams[3].sent == 65_536
    pair.same_out()
