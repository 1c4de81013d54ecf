"""The HPACK encoder for what the ingress sends (`http2.encoder`): RFC 7541's own examples as
a table, every block read back by hpack's decoder (the one the ingress reads clients with),
and the table size it tells a peer's decoder, first and after the peer's settings change."""

from __future__ import annotations

import random

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from wakeful.ingress.http2.encoder import (
    TABLE_SIZE_ZERO,
    FieldEncoder,
    field,
    fit,
    integer,
)


@pytest.mark.parametrize(
    ("value", "prefix", "flags", "wire"),
    [
        pytest.param(10, 5, 0, "0a", id="C.1.1: 10 in a 5-bit prefix"),
        pytest.param(1337, 5, 0, "1f9a0a", id="C.1.2: 1337 in a 5-bit prefix"),
        pytest.param(42, 8, 0, "2a", id="C.1.3: 42 at an octet's start"),
        pytest.param(30, 5, 0, "1e", id="one below the prefix's limit: one octet"),
        pytest.param(31, 5, 0, "1f00", id="the prefix's limit: a second octet of 0"),
        pytest.param(15 + 128, 4, 0x10, "1f8001", id="a continuation octet, flags kept"),
    ],
)
def test_integers(value: int, prefix: int, flags: int, wire: str) -> None:
    out = bytearray()
    integer(out, value, prefix, flags)
    assert out.hex() == wire


@pytest.mark.parametrize(
    ("name", "value", "wire"),
    [
        pytest.param(b":method", b"GET", "82", id="C.2.4: a static entry, indexed"),
        pytest.param(b":status", b"200", "88", id="status 200: index 8"),
        pytest.param(b":status", b"404", "8d", id="status 404: index 13"),
        pytest.param(
            b":path",
            b"/sample/path",
            "040c2f73616d706c652f70617468",
            id="C.2.2: a static name, not indexed",
        ),
        pytest.param(
            b":status", b"418", "0803343138", id="a status the table lacks: its name by index"
        ),
        pytest.param(
            b"x-request-id",
            b"ab",
            "000c782d726571756573742d6964026162",
            id="a name the table lacks: two literals",
        ),
        pytest.param(
            b"set-cookie",
            b"a=1",
            "1f2803613d31",
            id="set-cookie: never indexed, its name by index (55)",
        ),
        pytest.param(b"cookie", b"a", "1f110161", id="cookie: never indexed (index 32)"),
        pytest.param(b"cookie", b"", "a0", id="an empty cookie: the static entry itself"),
    ],
)
def test_fields(name: bytes, value: bytes, wire: str) -> None:
    out = bytearray()
    field(out, name, value)
    assert out.hex() == wire


def _read(block: bytes, decoder: hpack.Decoder) -> list[tuple[bytes, bytes]]:
    return [(bytes(name), bytes(value)) for name, value in decoder.decode(block, raw=True)]


def test_every_block_reads_back_as_it_was_given() -> None:
    """Blocks of one connection, in order, through one decoder: static hits, static names,
    new names, empty and long values (a length past one octet), any octet in a value."""
    rng = random.Random(42)
    names = [b":status", b"content-type", b"server", b"x-trace", b"set-cookie", b"grpc-status"]
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    for _ in range(300):
        headers = [
            (
                rng.choice(names),
                bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 3, 126, 127, 300)))),
            )
            for _ in range(rng.randrange(1, 8))
        ]
        headers.insert(0, (b":status", rng.choice((b"200", b"204", b"304", b"500", b"503"))))
        assert _read(encoder.encode(headers), decoder) == headers
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing was ever indexed


def test_the_first_block_and_the_first_after_a_new_limit_say_the_table_is_empty() -> None:
    encoder = FieldEncoder()
    headers = [(b":status", b"200")]
    assert encoder.encode(headers) == bytes([TABLE_SIZE_ZERO, 0x88])
    assert encoder.encode(headers) == b"\x88"
    encoder.header_table_size = 0  # the peer's SETTINGS_HEADER_TABLE_SIZE
    assert encoder.header_table_size == 0
    assert encoder.encode(headers) == bytes([TABLE_SIZE_ZERO, 0x88])
    assert encoder.encode(headers) == b"\x88"
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 0  # a decoder that allows no table at all reads it
    assert _read(bytes([TABLE_SIZE_ZERO, 0x88]), decoder) == headers


def test_an_h2_connection_sends_its_heads_through_it() -> None:
    """h2 asks the encoder it was fitted with: a client reads the answer's head, and a peer
    that lowers its table size gets the update at the next head."""
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    fit(server)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    server.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0})
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    for stream_id in (1, 3):
        client.send_headers(
            stream_id,
            [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "a.example")],
            end_stream=True,
        )
        server.receive_data(client.data_to_send())
        server.send_headers(stream_id, [(b":status", b"200"), (b"x-a", b"b")], end_stream=True)
        events = client.receive_data(server.data_to_send())
        heads = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        assert [list(e.headers) for e in heads] == [[(b":status", b"200"), (b"x-a", b"b")]]
