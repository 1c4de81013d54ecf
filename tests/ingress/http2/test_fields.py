"""HPACK both ways (`http2.fields`). The encoder: RFC 7541's own examples as a table, every
block read back by hpack's decoder, and the table size it tells a peer's decoder, first and
after the peer's settings change. The decoder: held to hpack's `Decoder` (the one it stands
in for) on the blocks real encoders make and on hostile ones, answer for answer and error for
error, and its bounds as a table."""

from __future__ import annotations

import random

import h2.config
import h2.connection
import h2.events
import hpack
import pytest
from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)

from tests.support.h2ref import fit
from wakeful.ingress.http2.fields import (
    TABLE_SIZE_ZERO,
    FieldDecoder,
    FieldEncoder,
    field,
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
    fit(server, 65536)
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


# -- the decoder -------------------------------------------------------------------------


def _outcome(decoder: hpack.Decoder | FieldDecoder, block: bytes) -> object:
    """The fields as bytes, or the exception's class."""
    try:
        return [(bytes(n), bytes(v)) for n, v in decoder.decode(block, raw=True)]
    except HPACKDecodingError as exc:
        return type(exc)


def _pair(limit: int = 65536) -> tuple[hpack.Decoder, FieldDecoder]:
    theirs = hpack.Decoder(max_header_list_size=limit)
    return theirs, FieldDecoder(limit)


def _same(blocks: list[bytes], limit: int = 65536, allowed: int | None = None) -> int:
    """Both decoders read `blocks` as one connection's; the same answer for every block and
    the same table after it, up to the first error (which ends a connection). The count of
    blocks read without an error."""
    theirs, ours = _pair(limit)
    if allowed is not None:
        theirs.max_allowed_table_size = ours.max_allowed_table_size = allowed
    for count, block in enumerate(blocks):
        expected = _outcome(theirs, block)
        assert _outcome(ours, block) == expected, block.hex()
        if isinstance(expected, type):
            return count
        assert list(ours._entries) == [
            (bytes(n), bytes(v)) for n, v in theirs.header_table.dynamic_entries
        ]
        assert ours.header_table_size == theirs.header_table_size
    return len(blocks)


def _requests(rng: random.Random, count: int) -> list[list[tuple[bytes, bytes]]]:
    paths = [b"/", b"/index.html", b"/api/v1/items?page=%d" % rng.randrange(9), b"/static/a.js"]
    return [
        [
            (b":method", rng.choice((b"GET", b"POST"))),
            (b":scheme", b"https"),
            (b":path", rng.choice(paths)),
            (b":authority", b"app.example"),
            (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64)"),
            (b"cookie", b"session=%d" % rng.randrange(3)),
            (b"x-" + bytes(rng.choice(b"abc") for _ in range(3)), b"v" * rng.randrange(200)),
        ]
        for _ in range(count)
    ]


@pytest.mark.parametrize("huffman", [True, False], ids=["huffman", "plain"])
@pytest.mark.parametrize("table", [4096, 256, 0], ids=["table 4096", "table 256", "no table"])
def test_blocks_real_encoders_make_read_as_hpack_reads_them(huffman: bool, table: int) -> None:
    """hpack's encoder indexing as it goes (evictions at the smaller sizes, a size update
    first when the table shrinks), with and without Huffman coding."""
    rng = random.Random(table + huffman)
    encoder = hpack.Encoder()
    blocks = []
    if table != 4096:
        encoder.header_table_size = table
    for headers in _requests(rng, 200):
        blocks.append(encoder.encode(headers, huffman=huffman))
    assert _same(blocks) == len(blocks)


def test_blocks_h2_clients_send_read_as_hpack_reads_them() -> None:
    """An h2 client's heads (never-indexed fields among them, h2's choice for cookies)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.data_to_send()
    blocks = []
    for stream_id, headers in zip(range(1, 300, 2), _requests(random.Random(7), 150), strict=True):
        client.send_headers(stream_id, headers, end_stream=True)
        frame = client.data_to_send()
        blocks.append(frame[9:])  # one HEADERS frame, no padding or priority
    assert _same(blocks) == len(blocks)


def test_hostile_blocks_get_the_answers_and_errors_hpack_gives() -> None:
    """Real blocks with octets flipped, cut short or spliced, and random octets: whatever
    hpack makes of them (fields, or which error), the decoder makes too."""
    rng = random.Random(1234)
    encoder = hpack.Encoder()
    real = [encoder.encode(h, huffman=rng.random() < 0.5) for h in _requests(rng, 60)]
    errors = 0
    for _ in range(3000):
        blocks = []
        for block in rng.sample(real, 4):
            mutated = bytearray(block)
            how = rng.randrange(5)
            if how == 0 and mutated:
                mutated[rng.randrange(len(mutated))] ^= 1 << rng.randrange(8)
            elif how == 1 and mutated:
                del mutated[rng.randrange(len(mutated)) :]
            elif how == 2:
                mutated[rng.randrange(len(mutated) + 1) : 0] = rng.randbytes(rng.randrange(1, 6))
            elif how == 3:
                mutated = bytearray(rng.randbytes(rng.randrange(1, 40)))
            blocks.append(bytes(mutated))
        read = _same(blocks, limit=rng.choice((65536, 300)), allowed=rng.choice((4096, 100)))
        errors += read < len(blocks)
    assert errors > 1000  # the cases reached the errors, not only the fields


@pytest.mark.parametrize(
    ("blocks", "allowed", "outcome"),
    [
        pytest.param(["80"], 4096, InvalidTableIndex, id="index 0"),
        pytest.param(["be"], 4096, InvalidTableIndex, id="index 62 with an empty table"),
        pytest.param(["bd"], 4096, [(b"www-authenticate", b"")], id="index 61: the last static"),
        pytest.param(["8220"], 4096, HPACKDecodingError, id="a size update after a field"),
        pytest.param(["3fe21f"], 4096, InvalidTableSizeError, id="a size update past the allowed"),
        pytest.param(["2082"], 4096, [(b":method", b"GET")], id="a size update to 0, first"),
        pytest.param(["ff8080808000"], 4096, InvalidTableIndex, id="six octets, ended: read"),
        pytest.param(["ff808080808000"], 4096, HPACKDecodingError, id="seven octets: too long"),
        pytest.param(["ff80"], 4096, HPACKDecodingError, id="an integer cut short"),
        pytest.param(["0405616263"], 4096, HPACKDecodingError, id="a value cut short"),
        pytest.param(["00"], 4096, HPACKDecodingError, id="a literal name missing"),
        pytest.param(["0481ff"], 4096, HPACKDecodingError, id="Huffman: EOS padding too long"),
        pytest.param(["82"], 100, InvalidTableSizeError, id="allowed shrank, no update came"),
        pytest.param(["3f45", "82"], 100, [(b":method", b"GET")], id="allowed shrank, updated"),
    ],
)
def test_the_bounds(blocks: list[str], allowed: int, outcome: object) -> None:
    theirs, ours = _pair()
    theirs.max_allowed_table_size = ours.max_allowed_table_size = allowed
    for block in blocks:
        got = _outcome(ours, bytes.fromhex(block))
        assert got == _outcome(theirs, bytes.fromhex(block))
    assert got == outcome


def test_a_header_list_past_its_bound_is_refused_where_hpack_refuses_it() -> None:
    block = hpack.Encoder().encode([(b"a", b"x" * 60), (b"b", b"y" * 60)], huffman=False)
    for limit, outcome in (
        (200, None),
        (180, OversizedHeaderListError),
        (90, OversizedHeaderListError),
    ):
        theirs, ours = _pair(limit)
        expected = _outcome(theirs, block)
        assert _outcome(ours, block) == expected
        if outcome is not None:
            assert expected is outcome


def test_an_entry_larger_than_the_table_empties_it() -> None:
    theirs, ours = _pair()
    encoder = hpack.Encoder()
    blocks = [
        encoder.encode([(b"a", b"1")]),
        b"\x40\x01b" + bytes([0x7F, 0x85, 0x1F]) + b"z" * 4100,
    ]
    for block in blocks:
        assert _outcome(ours, block) == _outcome(theirs, block)
    assert len(ours._entries) == len(theirs.header_table.dynamic_entries) == 0


def test_the_decoder_gives_bytes_only() -> None:
    with pytest.raises(ValueError, match="raw"):
        FieldDecoder(100).decode(b"\x82", raw=False)
