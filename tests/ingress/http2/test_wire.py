"""`http2.wire` held to `h2` (which the ingress used before), as the HPACK and the header
rules were: the same events and the same bytes out over real clients' traffic, the same
verdict over hostile frame sequences, but for the departures the module names (each tested
here on its own)."""

from __future__ import annotations

import random
from collections.abc import Callable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
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
from wakeful.ingress.http2 import frames, streams, wire

MAX_HEAD = 32 * 1024
WINDOW = 64 * 1024

REQUEST = [(":method", "POST"), (":path", "/"), (":scheme", "http"), (":authority", "h")]


class _Advertised(h2.settings.Settings):
    """As the ingress configured `h2`: MAX_CONCURRENT_STREAMS advertised, not enforced."""

    @property
    def max_concurrent_streams(self) -> int:
        return 2**31 - 1

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = value


def reference() -> h2.connection.H2Connection:
    """`h2` as `H2Connection` configured it before `wire` replaced it."""
    config = h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config)
    conn.local_settings = _Advertised(
        client=False,
        initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEAD,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
        },
    )
    fit(conn, MAX_HEAD)
    return conn


def ours() -> wire.Wire:
    return wire.Wire(100, MAX_HEAD, WINDOW)


class Pair(Compared):
    """`h2`'s server and `wire`, fed alike."""

    def __init__(self) -> None:
        self.ref = reference()
        self.new = ours()
        self.ref.initiate_connection()
        self.ref.increment_flow_control_window(1024 * 1024 - 65_535)
        self.new.initiate_connection()
        self.new.increment_flow_control_window(1024 * 1024 - 65_535)
        self.first = self.same_out()
        """The servers' first flight (SETTINGS, WINDOW_UPDATE), for the client."""

    def both(self, ref: Callable[[], object], new: Callable[[], object]) -> None:
        """One step on each; the same outcome: done, the stream gone (h2: closed, or below
        the highest once it purged a closed one), or the send refused (a rule of the stream)."""
        outcomes = []
        for step in (ref, new):
            try:
                step()
                outcomes.append("done")
            except (
                h2.exceptions.StreamClosedError,
                h2.exceptions.StreamIDTooLowError,
                streams.StreamGone,
            ) as exc:
                outcomes.append(f"gone: {exc!r}")
            except (h2.exceptions.ProtocolError, streams.CannotSend) as exc:
                outcomes.append(f"refused: {exc!r}")
        assert outcomes[0].split(":")[0] == outcomes[1].split(":")[0], outcomes


# -- real clients' traffic ------------------------------------------------------------------


def _client() -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.encoder = SmallHuffman()
    client.initiate_connection()
    return client


races: list[int] = []
refused: list[int] = []


def _converse(seed: int) -> int:
    """A random conversation between `h2`'s client and both servers; how many requests."""
    rng = random.Random(seed)
    client = _client()
    pair = Pair()
    answering: dict[int, int] = {}
    """Streams being answered: body bytes still to send."""
    requests = 0

    def deliver(data: bytes) -> None:
        at = 0
        while at < len(data):  # in reads of random sizes, as a socket splits them
            step = rng.choice((1, 9, 50, 4096, len(data)))
            for event in pair.receive(data[at : at + step]):
                if event[0] == wire.REQUEST:
                    answering[event[1]] = rng.choice((0, 10, 5000, 100_000))
                elif event[0] == wire.BODY and event[3] and rng.random() < 0.8:
                    size, stream_id = event[3], event[1]
                    pair.both(
                        lambda: pair.ref.acknowledge_received_data(size, stream_id),  # noqa: B023
                        lambda: pair.new.acknowledge(size, stream_id),  # noqa: B023
                    )
            at += step
        back = pair.same_out()
        if back:
            try:  # the client's own verdict on a race (an answer to a stream it reset)
                client.receive_data(back)  # ends the conversation, not the comparison
            except h2.exceptions.ProtocolError:
                races.append(seed)

    if rng.random() < 0.7:  # else the client never acknowledges the servers' SETTINGS
        client.receive_data(pair.first)
    sending = (h2.stream.StreamState.OPEN, h2.stream.StreamState.HALF_CLOSED_REMOTE)
    deliver(client.data_to_send())
    for _ in range(rng.randint(5, 40)):
        roll = rng.random()
        open_ids = [s for s, st in client.streams.items() if st.state_machine.state in sending]
        try:
            if roll < 0.06:  # mid-way, with streams open and answers waiting for windows
                client.update_settings(
                    {
                        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: rng.choice(
                            (0, 100, 32_767, 65_535, 2**20, 2**31 - 1)
                        ),
                        h2.settings.SettingCodes.MAX_FRAME_SIZE: rng.choice((16_384, 20_000)),
                        h2.settings.SettingCodes.HEADER_TABLE_SIZE: rng.choice((0, 100, 4096)),
                    }
                )
            elif roll < 0.35:
                stream_id = client.get_next_available_stream_id()
                headers = [
                    (":method", rng.choice(("GET", "POST"))),
                    (":path", f"/{rng.randint(0, 9999)}"),
                    (":scheme", "https"),
                    (":authority", "a.example"),
                    ("x-pad", "v" * rng.choice((1, 100, 20_000))),
                ]
                ended = rng.random() < 0.5
                client.send_headers(stream_id, headers, end_stream=ended)
                requests += 1
            elif roll < 0.55 and open_ids:
                stream_id = rng.choice(open_ids)
                size = rng.choice((0, 1, 1000, 16_384))
                window = client.local_flow_control_window(stream_id)
                size = min(size, window, client.max_outbound_frame_size - 256)
                pad = rng.choice((None, 0, 10, 255)) if size + 256 <= window else None
                client.send_data(
                    stream_id, b"d" * size, end_stream=rng.random() < 0.3, pad_length=pad
                )
            elif roll < 0.6 and open_ids:
                client.send_headers(rng.choice(open_ids), [("x-trailer", "t")], end_stream=True)
            elif roll < 0.65 and open_ids:
                client.reset_stream(rng.choice(open_ids), rng.choice((0, 8)))
            elif roll < 0.7:
                client.ping(rng.randbytes(8))
            elif roll < 0.75 and open_ids:
                client.increment_flow_control_window(rng.randint(1, 70_000), rng.choice(open_ids))
            elif roll < 0.8:
                client.increment_flow_control_window(rng.randint(1, 70_000))
            elif roll < 0.83 and open_ids:
                client.prioritize(rng.choice(open_ids), weight=rng.randint(1, 256))
            else:
                for stream_id, left in list(answering.items()):
                    _answer(rng, pair, stream_id, left, answering)
        except h2.exceptions.ProtocolError:
            pass
        try:
            deliver(client.data_to_send())
        except h2.exceptions.ProtocolError:  # both ended the connection, with the same code
            refused.append(seed)
            break
        if races and races[-1] == seed:
            break
    return requests


def _answer(
    rng: random.Random, pair: Pair, stream_id: int, left: int, answering: dict[int, int]
) -> None:
    """One step of the answer to `stream_id` on both servers."""
    if stream_id not in pair.new.streams and stream_id not in pair.ref.streams:
        del answering[stream_id]
        return
    roll = rng.random()
    if roll < 0.1:
        pair.both(
            lambda: pair.ref.reset_stream(stream_id, 8), lambda: pair.new.reset_stream(stream_id, 8)
        )
        del answering[stream_id]
        return
    stream = pair.new.streams.get(stream_id)
    if stream is not None and stream.heads == 0:
        big = b"b" * rng.choice((1, 30_000))
        head = [(b":status", b"200"), (b"content-type", b"text/plain"), (b"x-big", big)]
        end = left == 0
        pair.both(
            lambda: pair.ref.send_headers(stream_id, head, end_stream=end),
            lambda: pair.new.send_headers(stream_id, head, end_stream=end),
        )
        if end:
            del answering[stream_id]
        return
    try:
        window = pair.ref.local_flow_control_window(stream_id)
    except h2.exceptions.ProtocolError:
        window = 0
    if stream is not None:
        assert pair.new.local_flow_control_window(stream_id) == window
    window = min(window, pair.ref.max_outbound_frame_size)
    chunk = min(left, window, rng.choice((1, 1000, 16_384, 100_000)))
    last = chunk == left
    if roll < 0.2 and last:
        trailers = [(b"grpc-status", b"0")]
        if chunk:
            pair.both(
                lambda: pair.ref.send_data(stream_id, b"x" * chunk),
                lambda: pair.new.send_data(stream_id, b"x" * chunk),
            )
        pair.both(
            lambda: pair.ref.send_headers(stream_id, trailers, end_stream=True),
            lambda: pair.new.send_headers(stream_id, trailers, end_stream=True),
        )
    elif chunk or last:
        pair.both(
            lambda: pair.ref.send_data(stream_id, b"x" * chunk, end_stream=last),
            lambda: pair.new.send_data(stream_id, b"x" * chunk, end_stream=last),
        )
    if last:
        del answering[stream_id]
    else:
        answering[stream_id] = left - chunk


def test_real_clients_traffic_makes_the_same_events_and_bytes_as_h2() -> None:
    requests = sum(_converse(seed) for seed in range(400))
    assert requests > 2000


# -- hostile frame sequences ---------------------------------------------------------------


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return frames.frame(kind, flags, stream_id, payload)


def _hostile(rng: random.Random, encoder: hpack.Encoder, highest: list[int]) -> bytes:
    """One frame, valid or not: each field drawn from what breaks a rule and what does not."""
    kind = rng.choice((0, 0, 1, 1, 1, 2, 3, 3, 4, 4, 6, 8, 8, 9, 9, 5, 0xA, 0x10))
    ids = [0, 1, 2, highest[0], highest[0] + 2, max(1, highest[0] - 2), 2**31 - 1]
    stream_id = rng.choice(ids)
    flags = rng.choice((0, 1, 4, 5, 8, 9, 0x20, 0x24, 0x25, 0x2D, 0xFF))
    if kind in (1, 9):
        fields = REQUEST
        if rng.random() < 0.3:
            fields = [("x-trailer", "1")]
        block = encoder.encode(fields)
        if rng.random() < 0.1:
            block = rng.randbytes(rng.randint(0, 10))
        payload = block
        if kind == 1 and flags & 0x20:
            dep = stream_id if rng.random() < 0.3 else rng.choice(ids)
            payload = dep.to_bytes(4, "big") + bytes([rng.randrange(256)]) + payload
        if flags & 0x8:
            pad = rng.choice((0, 3, 255, len(payload), len(payload) + 1))
            payload = bytes([pad & 0xFF]) + payload + b"\0" * min(pad, 300)
        if kind == 1 and stream_id % 2 == 1 and stream_id > highest[0] and rng.random() < 0.5:
            highest[0] = stream_id
    elif kind == 0:
        payload = b"d" * rng.choice((0, 1, 100, 16_384, 20_000))
        if flags & 0x8:
            pad = rng.choice((0, 3, 255, len(payload), len(payload) + 1))
            payload = bytes([pad & 0xFF]) + payload[: max(0, len(payload) - pad)] + b"\0" * pad
    elif kind == 2:
        dep = stream_id if rng.random() < 0.3 else rng.choice(ids)
        payload = (dep.to_bytes(4, "big") + b"\x10")[: rng.choice((5, 5, 5, 4, 6))]
    elif kind == 3:
        payload = rng.choice((0, 8, 5)).to_bytes(4, "big")[: rng.choice((4, 4, 4, 3))]
    elif kind == 4:
        pieces = [
            rng.choice((1, 2, 3, 4, 5, 6, 8, 0x99)).to_bytes(2, "big")
            + rng.choice((0, 1, 2, 100, 16_383, 16_384, 70_000, 2**24, 2**31 - 1, 2**31)).to_bytes(
                4, "big"
            )
            for _ in range(rng.randint(0, 3))
        ]
        payload = b"".join(pieces)
        if rng.random() < 0.1:
            payload += b"\0"
    elif kind == 6:
        payload = b"p" * rng.choice((8, 8, 8, 7))
    elif kind == 8:
        payload = rng.choice((0, 1, 1000, 2**31 - 1, 2**32 - 1)).to_bytes(4, "big")
        payload = payload[: rng.choice((4, 4, 4, 5))]
    else:
        payload = rng.randbytes(rng.randint(0, 20))
    return _frame(kind, flags, stream_id, payload)


EXCUSED = {
    "trailers without END_STREAM": "a stream error here, a connection error in h2",
    "WINDOW_UPDATE of 0 on a stream": "a stream error here",
    "PRIORITY on its own stream": "a stream error here (ignored on a stream not open)",
    "HPACK": "COMPRESSION_ERROR here, PROTOCOL_ERROR in h2",
    "padding": "h2's HEADERS refuses padding one byte shorter than RFC 9113 allows",
    "SETTINGS acknowledgement with a payload": "FRAME_SIZE_ERROR (RFC 9113 §6.5), h2's "
    "PROTOCOL_ERROR",
    "ALTSVC": "a frame type RFC 9113 does not define, ignored here; h2 parses RFC 7838's",
    "PUSH_PROMISE": "refused at once here; h2 waits for the end of its header block first",
    "WINDOW_UPDATE's reserved bit": "ignored here (RFC 9113 §6.9); h2 refuses the increment",
    "CONTINUATION outside a header block": "PROTOCOL_ERROR (RFC 9113 §6.10); h2's answer "
    "depended on its stream's state (a reset stream's: a RST_STREAM)",
    "past the frame size": "refused from its header (FRAME_SIZE_ERROR) before anything else",
    "inside a header block": "a frame that interrupts a header block is refused for that before "
    "its own faults are read (h2 reads them first)",
}


def _excuse(data: bytes, ref: Norm, new: Norm, conn: wire.Wire, was_open: bool) -> str | None:
    """Which of the module's named departures a difference is, if one (`was_open`: the
    frame's stream was open in `wire` before it)."""
    if len(data) > 9 + 16_384 and ref[0] == "error" and new == ("error", frames.FRAME_SIZE_ERROR):
        return "past the frame size"
    if conn._block_id and ref[0] == "error" and new == ("error", frames.PROTOCOL_ERROR):
        return "inside a header block"
    kind, flags = data[3], data[4]
    stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
    if ref[0] == "error" and new[0] == "error" and new[1] == frames.COMPRESSION_ERROR:
        return "HPACK"
    if kind == 0xA and ref[0] == "error" and new == ("ok", (), b""):
        return "ALTSVC"
    if kind == 5 and new == ("error", frames.PROTOCOL_ERROR):
        return "PUSH_PROMISE"
    if kind == 4 and flags & 1 and len(data) > 9 and new == ("error", frames.FRAME_SIZE_ERROR):
        return "SETTINGS acknowledgement with a payload"
    if kind == 9 and new == ("error", frames.PROTOCOL_ERROR) and not conn._block_id:
        return "CONTINUATION outside a header block"
    if ref[0] != "error":
        return None
    stream_error = reset_here(new, stream_id, frames.PROTOCOL_ERROR)
    if kind == 1 and flags & 0x20:
        at = 9 + (1 if flags & 8 else 0)
        if int.from_bytes(data[at : at + 4], "big") & 0x7FFFFFFF == stream_id and stream_error:
            return "PRIORITY on its own stream"
    if kind in (1, 9) and flags & 0x8 and new[0] == "ok":
        return "padding"
    if kind in (1, 9) and was_open and stream_error:
        return "trailers without END_STREAM"
    reserved = kind == 8 and len(data) == 13 and data[9] & 0x80
    if reserved and (new[0] == "ok" or new == ("error", frames.FLOW_CONTROL_ERROR)):
        return "WINDOW_UPDATE's reserved bit"
    zero = kind == 8 and int.from_bytes(data[9:13], "big") & 0x7FFFFFFF == 0
    if zero and (stream_error or (not was_open and new == ("ok", (), b""))):
        return "WINDOW_UPDATE of 0 on a stream"
    self_dependent = kind == 2 and int.from_bytes(data[9:13], "big") & 0x7FFFFFFF == stream_id
    if self_dependent and (stream_error or (not was_open and new == ("ok", (), b""))):
        return "PRIORITY on its own stream"
    return None


def _act(rng: random.Random, ref: h2.connection.H2Connection, new: wire.Wire) -> None:
    """The server answers, ends or resets a stream open in both (or does nothing): the two
    the same, their bytes out the same."""
    open_ids = sorted(
        {i for i, st in new.streams.items() if st.local_open}  # (h2 closes a stream that
        & {i for i, st in ref.streams.items() if st.open}  # is sent on after its end)
    )
    if not open_ids:
        return
    stream_id = rng.choice(open_ids)
    head = [(b":status", b"200")]
    roll = rng.random()
    outcomes = []
    for step in (
        (
            (lambda: ref.send_headers(stream_id, head, end_stream=True)),
            (lambda: new.send_headers(stream_id, head, end_stream=True)),
        )
        if roll < 0.6
        else (
            (lambda: ref.reset_stream(stream_id, 8)),
            (lambda: new.reset_stream(stream_id, 8)),
        )
    ):
        try:
            step()
            outcomes.append("done")
        except (h2.exceptions.ProtocolError, streams.CannotSend, streams.StreamGone) as exc:
            outcomes.append(repr(exc))
    assert outcomes == ["done", "done"], outcomes
    assert new.data_to_send() == ref.data_to_send()


def test_hostile_frame_sequences_get_h2s_verdict() -> None:
    """Valid requests, then frames each drawn to break one rule or none, fed one a read to
    `h2` and to `wire`, the server answering or resetting streams between them: the same
    events and bytes while both accept, the same connection error code when `h2` refuses,
    but for the named departures (each checked for what `wire` did instead); `wire` raises
    nothing but WireError."""
    rng = random.Random(20261207)
    compared = excused = 0
    seen: dict[str, int] = {}
    for _ in range(3000):
        ref, new = reference(), ours()
        encoder = hpack.Encoder()
        highest = [1]
        sent = [frames.PREFACE + _frame(4, 0, 0, b"")]
        if rng.random() < 0.7:
            sent.append(_frame(4, 1, 0, b""))  # the client acknowledges the server's
        sent.append(_frame(1, 4 | rng.choice((0, 1)), 1, encoder.encode(REQUEST)))
        sent += [_hostile(rng, encoder, highest) for _ in range(rng.randint(1, 12))]
        for data in sent:
            stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            was_open = stream_id in new.streams
            r, n = verdicts(ref, new, data)
            if r != n:
                why = _excuse(data, r, n, new, was_open)
                assert why is not None, (
                    f"frame {data[:40].hex()}: h2 {r!r:.300}, wire {n!r:.300}; after "
                    + " ".join(f[:20].hex() for f in sent[: sent.index(data)])
                )
                seen[why] = seen.get(why, 0) + 1
                excused += 1
                break
            compared += 1
            if r[0] == "error":
                break
            if rng.random() < 0.3:
                _act(rng, ref, new)
    assert compared > 9000, (compared, seen)
    assert excused < 1000, seen


# -- the departures, one by one --------------------------------------------------------------


def _opened(end_stream: bool = False) -> tuple[wire.Wire, hpack.Encoder]:
    new = ours()
    encoder = hpack.Encoder()
    head = encoder.encode(REQUEST)
    new.receive(frames.PREFACE + _frame(4, 0, 0, b"") + _frame(1, 4 | int(end_stream), 1, head))
    new.data_to_send()
    return new, encoder


def _rst(stream_id: int, code: int) -> bytes:
    return _frame(frames.RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def test_trailers_without_end_stream_reset_the_stream_alone() -> None:
    new, encoder = _opened()
    events = new.receive(_frame(1, 4, 1, encoder.encode([("x-trailer", "1")])))
    assert [(e.kind, e.stream_id, e.code, e.remote) for e in events] == [
        (wire.RESET, 1, frames.PROTOCOL_ERROR, False)
    ]
    assert new.data_to_send() == _rst(1, frames.PROTOCOL_ERROR)
    assert 1 not in new.streams


def test_a_zero_window_update_on_a_stream_resets_it_alone() -> None:
    new, _ = _opened()
    events = new.receive(_frame(frames.WINDOW_UPDATE, 0, 1, (0).to_bytes(4, "big")))
    assert [(e.kind, e.code) for e in events] == [(wire.RESET, frames.PROTOCOL_ERROR)]
    assert new.data_to_send() == _rst(1, frames.PROTOCOL_ERROR)
    with pytest.raises(wire.WireError) as exc:  # on the connection: a connection error
        new.receive(_frame(frames.WINDOW_UPDATE, 0, 0, (0).to_bytes(4, "big")))
    assert exc.value.code == frames.PROTOCOL_ERROR


def test_a_stream_depending_on_itself_is_reset_alone() -> None:
    new, _ = _opened()
    events = new.receive(_frame(frames.PRIORITY, 0, 1, (1).to_bytes(4, "big") + b"\x10"))
    assert [(e.kind, e.code) for e in events] == [(wire.RESET, frames.PROTOCOL_ERROR)]
    assert new.data_to_send() == _rst(1, frames.PROTOCOL_ERROR)
    assert new.receive(_frame(frames.PRIORITY, 0, 7, (7).to_bytes(4, "big") + b"\x10")) == []


def test_an_hpack_error_is_a_compression_error() -> None:
    new, _ = _opened()
    with pytest.raises(wire.WireError) as exc:
        new.receive(_frame(1, 5, 3, b"\xff\xff\xff\xff\xff\xff\xff"))
    assert exc.value.code == frames.COMPRESSION_ERROR
    goaway = new.data_to_send()
    assert goaway[3] == frames.GOAWAY and goaway[9:17] == (1).to_bytes(4, "big") + b"\0\0\0\x09"


def test_a_frame_past_the_frame_size_is_refused_from_its_header() -> None:
    new, _ = _opened()
    with pytest.raises(wire.WireError) as exc:
        new.receive(b"\x01\0\0" + bytes([frames.DATA, 0]) + (1).to_bytes(4, "big"))
    assert exc.value.code == frames.FRAME_SIZE_ERROR


def test_data_after_the_client_ended_resets_the_stream_and_keeps_the_window() -> None:
    new, _ = _opened(end_stream=True)
    events = new.receive(_frame(frames.DATA, 0, 1, b"x" * 100))
    assert [(e.kind, e.code) for e in events] == [(wire.RESET, frames.STREAM_CLOSED)]
    assert new.data_to_send() == _rst(1, frames.STREAM_CLOSED)
    assert new.inbound.current == 65_535 - 100


def test_sending_on_a_closed_stream_says_it_is_gone() -> None:
    new, _ = _opened(end_stream=True)
    new.send_headers(1, [(b":status", b"200")], end_stream=True)
    for send in (
        lambda: new.send_data(1, b"x"),
        lambda: new.end_stream(1),
        lambda: new.reset_stream(1, 8),
        lambda: new.local_flow_control_window(1),
    ):
        with pytest.raises(streams.StreamGone):
            send()


# -- what the comparisons reach seldom, each on its own --------------------------------------


def _settings(*pairs: tuple[int, int]) -> bytes:
    payload = b"".join(code.to_bytes(2, "big") + value.to_bytes(4, "big") for code, value in pairs)
    return _frame(frames.SETTINGS, 0, 0, payload)


def _window(stream_id: int, increment: int) -> bytes:
    return _frame(frames.WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def test_window_gives_back_what_h2s_window_manager_does() -> None:
    """`Window` against h2's `WindowManager` over random consumption, processing and
    openings: the same increments, the same sizes, the same refusals."""
    from h2.windows import WindowManager

    rng = random.Random(42)
    for _ in range(2000):
        size = rng.choice((0, 1, 100, 1024, 4096, 65_535, 65_536, 2**20))
        ours_, theirs = frames.Window(size), WindowManager(size)
        for _ in range(30):
            op, n = rng.random(), rng.choice((0, 1, 10, 1023, 1024, 1025, 32_767, 32_768, 70_000))
            if op < 0.4:
                failed = []
                for manager in (ours_, theirs):
                    try:
                        (manager.consumed if manager is ours_ else manager.window_consumed)(n)
                        failed.append(False)
                    except (frames.Fault, h2.exceptions.FlowControlError):
                        failed.append(True)
                assert failed[0] == failed[1]
                if failed[0]:
                    break
            elif op < 0.8:
                assert ours_.processed_bytes(n) == (theirs.process_bytes(n) or 0)
            elif n:
                ours_.opened(n)
                theirs.window_opened(n)
            assert (ours_.current, ours_.largest) == (
                theirs.current_window_size,
                theirs.max_window_size,
            )


def test_a_client_initial_window_moves_the_windows_of_open_streams() -> None:
    new, _ = _opened()
    new.receive(_settings((frames.INITIAL_WINDOW_SIZE, 100)))
    assert new.local_flow_control_window(1) == 100
    with pytest.raises(streams.CannotSend):
        new.send_data(1, b"x" * 101)
    new.send_data(1, b"x" * 100)
    new.receive(_settings((frames.INITIAL_WINDOW_SIZE, 50)))
    assert new.local_flow_control_window(1) == -50  # owed, as RFC 9113 §6.9.2 has it
    new.receive(_window(1, 2**31 - 1))
    with pytest.raises(wire.WireError) as exc:  # a stream's window past 2^31-1
        new.receive(_settings((frames.INITIAL_WINDOW_SIZE, 2**31 - 1)))
    assert exc.value.code == frames.FLOW_CONTROL_ERROR


def test_our_stream_window_holds_once_the_client_acknowledges_it() -> None:
    """Until our SETTINGS are acknowledged, a stream takes the default window (the client
    may have sent it before it read ours); after, ours, for new streams and open ones."""
    new = wire.Wire(100, MAX_HEAD, 1000)
    encoder = hpack.Encoder()
    new.receive(frames.PREFACE + _frame(4, 0, 0, b"") + _frame(1, 4, 1, encoder.encode(REQUEST)))
    new.receive(_frame(frames.DATA, 0, 1, b"x" * 1000))
    new.receive(_frame(frames.SETTINGS, frames.ACK, 0, b""))
    with pytest.raises(wire.WireError) as exc:  # 65,535 less 64,535: 1,000 left, then none
        new.receive(_frame(frames.DATA, 0, 1, b"x" * 1))
    assert exc.value.code == frames.FLOW_CONTROL_ERROR
    fresh = wire.Wire(100, MAX_HEAD, 1000)
    fresh.receive(
        frames.PREFACE + _frame(4, 0, 0, b"") + _frame(frames.SETTINGS, frames.ACK, 0, b"")
    )
    fresh.receive(_frame(1, 4, 1, hpack.Encoder().encode(REQUEST)))
    fresh.receive(_frame(frames.DATA, 0, 1, b"x" * 1000))
    with pytest.raises(wire.WireError):
        fresh.receive(_frame(frames.DATA, 0, 1, b"x"))


def test_data_on_a_closed_stream_is_refused_counted_and_its_window_given_back() -> None:
    new, _ = _opened()
    new.reset_stream(1, frames.CANCEL)
    new.data_to_send()
    for _ in range(40):
        new.receive(_frame(frames.DATA, 0, 1, b"x" * 16_384))
    out = new.data_to_send()
    assert out.count(_rst(1, frames.STREAM_CLOSED)) == 40
    assert b"\0\0\x04\x08\0\0\0\0\0" in out  # WINDOW_UPDATE on the connection: what
    assert new.inbound.current > 0  # came on the closed stream was given back
    assert new.take_stray() == 0  # DATA with bytes: bounded by the windows, not counted
    for _ in range(3):
        new.receive(_frame(frames.DATA, frames.END_STREAM, 1, b""))  # takes no window: counted
    new.receive(_frame(1, 5, 1, hpack.Encoder().encode(REQUEST)))  # HEADERS: counted
    assert new.take_stray() == 4 and new.take_stray() == 0


def test_closed_streams_are_remembered_within_a_bound() -> None:
    new = ours()
    encoder = hpack.Encoder()
    new.receive(frames.PREFACE + _frame(4, 0, 0, b""))
    for stream_id in range(1, 2 * (streams.CLOSED_KEPT + 100), 2):
        new.receive(_frame(1, 5, stream_id, encoder.encode(REQUEST)))
        new.reset_stream(stream_id, frames.CANCEL)
    assert len(new._closed) == streams.CLOSED_KEPT and not new.streams
    new.data_to_send()
    last = 2 * (streams.CLOSED_KEPT + 100) - 3
    new.receive(_frame(1, 5, last, encoder.encode(REQUEST)))  # late, after our reset
    assert new.data_to_send() == _rst(last, frames.STREAM_CLOSED)
    with pytest.raises(wire.WireError) as exc:  # forgotten: below the highest, a skipped id
        new.receive(_frame(1, 5, 1, encoder.encode(REQUEST)))
    assert exc.value.code == frames.PROTOCOL_ERROR


def test_a_stream_closes_once_both_sides_ended() -> None:
    new, _ = _opened()
    new.send_headers(1, [(b":status", b"200")], end_stream=True)
    assert 1 in new.streams  # the client's side is open
    assert [e.kind for e in new.receive(_frame(frames.DATA, frames.END_STREAM, 1, b""))] == [
        wire.BODY
    ]
    assert 1 not in new.streams and new._closed[1] is False
    with pytest.raises(wire.WireError) as exc:
        new.receive(_frame(1, 5, 1, hpack.Encoder().encode(REQUEST)))
    assert exc.value.code == frames.STREAM_CLOSED


def test_what_may_not_be_sent_is_refused() -> None:
    new, _ = _opened()
    with pytest.raises(streams.CannotSend):  # an informational answer cannot end the stream
        new.send_headers(1, [(b":status", b"103")], end_stream=True)
    new.send_headers(1, [(b":status", b"200")])
    with pytest.raises(streams.CannotSend):  # trailers must end it
        new.send_headers(1, [(b"x-t", b"1")])
    with pytest.raises(streams.CannotSend):
        new.send_data(1, b"x" * (DEFAULT_FRAME + 1))
    new.end_stream(1)
    with pytest.raises(streams.CannotSend):
        new.send_data(1, b"x")


DEFAULT_FRAME = 16_384


def test_a_headers_frame_too_short_for_its_priority_is_a_frame_size_error() -> None:
    new, _ = _opened()
    with pytest.raises(wire.WireError) as exc:
        new.receive(_frame(1, 0x24, 3, b"\0\0\0"))
    assert exc.value.code == frames.FRAME_SIZE_ERROR


def test_trailers_depending_on_their_own_stream_reset_it() -> None:
    new, encoder = _opened()
    block = (1).to_bytes(4, "big") + b"\x10" + encoder.encode([("x-t", "1")])
    events = new.receive(_frame(1, 0x25, 1, block))
    assert [(e.kind, e.code) for e in events] == [(wire.RESET, frames.PROTOCOL_ERROR)]


def test_after_a_connection_error_nothing_more_is_sent_or_read() -> None:
    new, encoder = _opened()
    new.receive(_frame(1, 4, 3, encoder.encode(REQUEST)))
    new.data_to_send()
    with pytest.raises(wire.WireError):
        new.receive(_frame(frames.PING, 0, 1, b"x" * 8))
    goaway = new.data_to_send()
    assert goaway == frames.goaway_frame(3, frames.PROTOCOL_ERROR)
    for send in (
        lambda: new.send_headers(1, [(b":status", b"200")]),
        lambda: new.reset_stream(3, frames.CANCEL),
        lambda: new.local_flow_control_window(1),
    ):
        with pytest.raises(streams.StreamGone):
            send()
    new.acknowledge(100_000, 1)
    new.close_connection(frames.NO_ERROR)
    assert new.receive(_frame(frames.PING, 0, 0, b"x" * 8)) == []
    assert new.data_to_send() == b""


def test_a_stream_takes_our_larger_window_before_the_acknowledgement() -> None:
    new = wire.Wire(100, MAX_HEAD, 65_536)
    new.increment_flow_control_window(1_000_000)
    new.receive(
        frames.PREFACE + _frame(4, 0, 0, b"") + _frame(1, 4, 1, hpack.Encoder().encode(REQUEST))
    )
    for _ in range(4):
        new.receive(_frame(frames.DATA, 0, 1, b"x" * 16_384))  # 65,536: one past the default
    assert new.streams[1].inbound.current == 0


def test_nothing_is_acknowledged_after_a_connection_error() -> None:
    new, _ = _opened()
    new.receive(_frame(frames.DATA, 0, 1, b"x" * 16_384))
    new.receive(_frame(frames.DATA, 0, 1, b"x" * 16_384))
    new.data_to_send()
    with pytest.raises(wire.WireError):
        new.receive(_frame(frames.PING, 0, 1, b"x" * 8))
    new.data_to_send()
    new.acknowledge(32_768, 1)  # would open both windows (half of each)
    assert new.data_to_send() == b""


def test_padding_into_a_headers_priority_is_a_protocol_error() -> None:
    new, _ = _opened()
    with pytest.raises(wire.WireError) as exc:  # 6 bytes: pad length 2, then 3 left for 5
        new.receive(_frame(1, 0x2C, 3, b"\x02" + b"\0\0\0" + b"\0\0"))
    assert exc.value.code == frames.PROTOCOL_ERROR


def test_a_goaway_after_a_graceful_one_names_no_higher_stream() -> None:
    new, encoder = _opened()
    new.named_last = 1  # a graceful GOAWAY named stream 1
    new.receive(_frame(1, 4, 3, encoder.encode(REQUEST)))
    new.data_to_send()
    with pytest.raises(wire.WireError):
        new.receive(_frame(frames.PING, 0, 1, b"x" * 8))
    assert new.data_to_send() == frames.goaway_frame(1, frames.PROTOCOL_ERROR)
