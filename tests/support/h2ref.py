"""`h2` as the reference the ingress's HTTP/2 framing is held to (`tests/ingress/http2/
test_wire.py`, the server side; `test_client.py`, the sandbox side): `h2` fitted with the
ingress's HPACK, each side's events in one comparable form, and the steps both take."""

from __future__ import annotations

from typing import Any, cast

import h2.connection
import h2.events
import h2.exceptions
import hpack
import pytest

from wakeful.ingress.http2 import client, wire
from wakeful.ingress.http2.fields import FieldDecoder, FieldEncoder

Norm = tuple[Any, ...]


def fit(conn: h2.connection.H2Connection, max_header_list_size: int) -> None:
    """Make `FieldEncoder` and `FieldDecoder` the codecs of `conn` (h2 asks its encoder for
    `encode` and sets its `header_table_size`; asks its decoder for `decode` and sets its
    `max_header_list_size` and `max_allowed_table_size`; nothing else)."""
    conn.encoder = cast(hpack.Encoder, FieldEncoder())
    conn.decoder = cast(hpack.Decoder, FieldDecoder(max_header_list_size))


class SmallHuffman(hpack.Encoder):
    """hpack's encoder, Huffman-coding small heads only: hpack codes 20 KB in pure Python
    at some 10 ms (most of the tests' time); the decoder's Huffman is exercised either way."""

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        headers = list(headers.items() if isinstance(headers, dict) else headers)
        small = sum(len(field[1]) for field in headers) < 1000
        return super().encode(headers, huffman=huffman and small)


def norm_h2(events: list[h2.events.Event]) -> list[Norm]:
    """`h2`'s events as `norm_ours` puts the wire's (a head's END_STREAM folded in)."""
    out: list[Norm] = []
    for e in events:
        if isinstance(e, h2.events.RequestReceived | h2.events.ResponseReceived):
            kind = wire.REQUEST if isinstance(e, h2.events.RequestReceived) else client.ANSWER
            out.append((kind, e.stream_id, e.headers, e.stream_ended is not None))
        elif isinstance(e, h2.events.DataReceived):
            ended = e.stream_ended is not None
            out.append((wire.BODY, e.stream_id, e.data, e.flow_controlled_length, ended))
        elif isinstance(e, h2.events.TrailersReceived):
            out.append((wire.TRAILERS, e.stream_id, e.headers))
        elif isinstance(e, h2.events.StreamReset):
            out.append((wire.RESET, e.stream_id, e.remote_reset, int(e.error_code)))
        elif isinstance(e, h2.events.WindowUpdated):
            out.append((wire.WINDOW, e.stream_id))
        elif isinstance(e, h2.events.RemoteSettingsChanged):
            out.append((wire.WINDOW, 0))
    return out


def norm_ours(events: list[wire.Event]) -> list[Norm]:
    out: list[Norm] = []
    for e in events:
        if e.kind in (wire.REQUEST, client.ANSWER):
            out.append((e.kind, e.stream_id, e.headers, e.ended))
        elif e.kind == wire.BODY:
            out.append((wire.BODY, e.stream_id, e.data, e.flow, e.ended))
        elif e.kind == wire.TRAILERS:
            out.append((wire.TRAILERS, e.stream_id, e.headers))
        elif e.kind == wire.RESET:
            out.append((wire.RESET, e.stream_id, e.remote, e.code))
        else:
            out.append((wire.WINDOW, e.stream_id))
    return out


def reset_here(new: Norm, stream_id: int, code: int) -> bool:
    """The wire took the frame and reset `stream_id` with `code` for it (a stream error)."""
    return new[0] == "ok" and (wire.RESET, stream_id, False, code) in new[1]


class Compared:
    """`h2` (`ref`) and the wire (`new`) fed alike; each step's events and bytes compared."""

    ref: h2.connection.H2Connection
    new: wire.Wire

    def same_out(self) -> bytes:
        ref, new = self.ref.data_to_send(), self.new.data_to_send()
        assert new == ref
        return ref

    def receive(self, data: bytes) -> list[Norm]:
        """The events of `data`, the same from both; ProtocolError if both refused it
        with the same code."""
        # h2 purges its closed streams when they are counted, lazily: a closed stream it
        # still holds takes a SETTINGS' window change, and may overflow
        self.ref.open_inbound_streams  # noqa: B018
        self.ref.open_outbound_streams  # noqa: B018
        try:
            ref = norm_h2(self.ref.receive_data(data))
        except h2.exceptions.ProtocolError as exc:
            refused = exc
        else:
            new = norm_ours(self.new.receive(data))
            assert new == ref
            return ref
        with pytest.raises(wire.WireError) as new_exc:
            self.new.receive(data)
        assert new_exc.value.code == refused.error_code, (refused, new_exc.value)
        self.same_out()
        raise refused


def verdicts(ref: h2.connection.H2Connection, new: wire.Wire, data: bytes) -> tuple[Norm, Norm]:
    """What each made of `data`: ("ok", its events, its bytes out) or ("error", the code)."""
    ref.open_inbound_streams  # noqa: B018 (h2 purges its closed streams, as in `receive`)
    ref.open_outbound_streams  # noqa: B018
    try:
        r: Norm = ("ok", tuple(norm_h2(ref.receive_data(data))), ref.data_to_send())
    except h2.exceptions.ProtocolError as exc:
        r = ("error", int(exc.error_code))
    try:
        n: Norm = ("ok", tuple(norm_ours(new.receive(data))), new.data_to_send())
    except wire.WireError as exc:
        n = ("error", exc.code)
    return r, n
