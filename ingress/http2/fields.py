"""HPACK (RFC 7541) for the ingress's HTTP/2, both ways, compiled: `FieldEncoder` for what
it sends (answers to clients, requests to h2c apps), `FieldDecoder` for what it reads (clients'
requests, h2c apps' answers). A client connection's `http2.wire` makes its own; `fit` gives
an `h2` connection (an h2c app's, `upstream.h2c`) both.

Every header block goes through an encoder or a decoder. hpack's are pure
Python: its encoder looks each field up in its tables, its decoder took 8.6 µs for a request
whose fields the client's table already held (most, after a connection's first); together
about a fifth of a small HTTP/2 request's CPU (docs/design/http2.md, "Measured").

Sending never needs a dynamic table (§2.3.2: an encoder chooses what to index), so
`FieldEncoder` indexes nothing: a field whose name and value are a static entry is one byte,
one whose name is is its index and a literal value, any other two literals; no Huffman coding
(a few bytes more a head). The peer's decoder is told at the first block, and again after each
change of its SETTINGS_HEADER_TABLE_SIZE, that the table this encoder uses holds nothing (a
dynamic table size update to 0, §6.3): whatever size the peer allows, 0 is within it. What it
is given was made safe already (`headers.client_response_headers`, `upstream.h2c`).

`FieldDecoder` does what hpack 4's `Decoder.decode(data, raw=True)` does, rule for rule: the
same representations (§6), the same bounds (an integer of at most `VARINT_MAX_LENGTH` octets
after its prefix, a table size update only at a block's start and never above
`max_allowed_table_size`, the table's size checked after each block, the header list's size
(each field's octets and 32, §4.1) checked after each field against `max_header_list_size`),
the same dynamic table (§4: newest first, evicted oldest first, emptied by an entry larger
than itself), and hpack's own exceptions, which `h2` and `http2.wire` turn into a connection
error.
Huffman-coded strings go to hpack's own `decode_huffman`. `tests/ingress/http2/test_fields.py`
holds the two decoders to the same answers, on blocks real encoders made and on hostile ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final

from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

# -- out -----------------------------------------------------------------------------------


def _static() -> tuple[dict[bytes, int], dict[bytes, dict[bytes, int]]]:
    names: dict[bytes, int] = {}
    pairs: dict[bytes, dict[bytes, int]] = {}
    for index, (name, value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
        names.setdefault(name, index)
        pairs.setdefault(name, {}).setdefault(value, index)
    return names, pairs


_NAMES, _PAIRS = _static()
NAMES: Final[dict[bytes, int]] = _NAMES
"""A static entry's name: its first index (RFC 7541 Appendix A)."""
PAIRS: Final[dict[bytes, dict[bytes, int]]] = _PAIRS
"""A static entry's name and value: its index."""
NEVER_INDEXED: Final = frozenset(
    (b"authorization", b"proxy-authorization", b"cookie", b"set-cookie")
)
"""Sent as never indexed (§6.2.3): an intermediary that re-encodes them must not index them
either (§7.1.3)."""
TABLE_SIZE_ZERO: Final = 0x20
"""A dynamic table size update to 0 (§6.3: 001, then 0 in a 5-bit prefix)."""


def integer(out: bytearray, value: int, prefix_bits: int, flags: int) -> None:
    """Append `value` in an N-bit prefix (RFC 7541 §5.1), the byte's other bits `flags`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        out.append(flags | value)
        return
    out.append(flags | limit)
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def literal(out: bytearray, data: bytes) -> None:
    """A string literal without Huffman coding (§5.2)."""
    integer(out, len(data), 7, 0)
    out += data


def field(out: bytearray, name: bytes, value: bytes) -> None:
    """One field (§6): indexed when the static table holds it whole, else a literal that is
    not indexed (or never indexed, `NEVER_INDEXED`), its name by index when the table has it."""
    values = PAIRS.get(name)
    if values is not None:
        index = values.get(value, 0)
        if index:
            integer(out, index, 7, 0x80)
            return
    flags = 0x10 if name in NEVER_INDEXED else 0x00
    index = NAMES.get(name, 0)
    if index:
        integer(out, index, 4, flags)
    else:
        out.append(flags)
        literal(out, name)
    literal(out, value)


class FieldEncoder:
    """What `h2.connection.H2Connection.encoder` is asked: `encode` a header block, and the
    peer's `header_table_size` when its settings change it."""

    def __init__(self) -> None:
        self._told = False
        """The peer's decoder was told, since its last limit, that the table holds nothing."""
        self._limit = HeaderTable.DEFAULT_SIZE

    @property
    def header_table_size(self) -> int:
        return self._limit

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        self._limit = value
        self._told = False

    def encode(self, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        """The block for `headers` (names lower-case, as HTTP/2 has them)."""
        out = bytearray()
        if not self._told:
            out.append(TABLE_SIZE_ZERO)
        for name, value in headers:
            field(out, name, value)
        self._told = True  # once the block is whole: h2 may refuse a field while it is made
        return bytes(out)


# -- in ------------------------------------------------------------------------------------

STATIC: Final[tuple[tuple[bytes, bytes], ...]] = tuple(HeaderTable.STATIC_TABLE)
STATIC_LENGTH: Final = len(STATIC)
VARINT_MAX_LENGTH: Final = 5
"""Octets an integer may take after its prefix's (hpack's bound, as hpack counts it: the
prefix and five more, the last ending it)."""
ENTRY_OVERHEAD: Final = 32
"""What a table entry or a header list counts for each field beyond its octets (§4.1)."""


class FieldDecoder:
    """What `h2.connection.H2Connection.decoder` is asked: `decode` a header block; and
    `max_header_list_size`, `max_allowed_table_size`, which `h2` sets from the settings."""

    def __init__(self, max_header_list_size: int) -> None:
        self.max_header_list_size = max_header_list_size
        self.max_allowed_table_size = HeaderTable.DEFAULT_SIZE
        self._max = HeaderTable.DEFAULT_SIZE
        self._size = 0
        self._entries: deque[tuple[bytes, bytes]] = deque()
        """The dynamic table, newest first (index `STATIC_LENGTH + 1`)."""

    @property
    def header_table_size(self) -> int:
        return self._max

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        self._max = value
        if value <= 0:
            self._entries.clear()
            self._size = 0
        else:
            self._shrink()

    def decode(self, data: bytes, raw: bool = True) -> list[tuple[bytes, bytes]]:
        """The fields of one header block, in order, as bytes (`h2` asks with `raw`)."""
        if not raw:
            raise ValueError("FieldDecoder gives fields as bytes only (raw=True)")
        fields: list[tuple[bytes, bytes]] = []
        inflated = 0
        at = 0
        end = len(data)
        while at < end:
            first = data[at]
            if first & 0x80:  # an indexed field (§6.1)
                index, at = read_integer(data, at, 7)
                pair = self._entry(index)
            elif first & 0x40:  # a literal added to the table (§6.2.1)
                pair, at = self._literal(data, at, 6)
                self._add(pair[0], pair[1])
            elif first & 0x20:  # a table size update (§6.3): only before any field
                if fields:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                size, at = read_integer(data, at, 5)
                if size > self.max_allowed_table_size:
                    raise InvalidTableSizeError("Encoder exceeded max allowable table size")
                self.header_table_size = size
                continue
            else:  # a literal not added, or never to be (§6.2.2, §6.2.3)
                pair, at = self._literal(data, at, 4)
            fields.append(pair)
            inflated += ENTRY_OVERHEAD + len(pair[0]) + len(pair[1])
            if inflated > self.max_header_list_size:
                raise OversizedHeaderListError(
                    f"A header list larger than {self.max_header_list_size} has been received"
                )
        if self._max > self.max_allowed_table_size:
            raise InvalidTableSizeError("Encoder did not shrink table size to within the max")
        return fields

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if index > 0:
            if index <= STATIC_LENGTH:
                return STATIC[index - 1]
            dynamic = index - STATIC_LENGTH - 1
            if dynamic < len(self._entries):
                return self._entries[dynamic]
        raise InvalidTableIndex(f"Invalid table index {index}")

    def _literal(self, data: bytes, at: int, prefix_bits: int) -> tuple[tuple[bytes, bytes], int]:
        """A literal field at `at`, its name indexed in `prefix_bits` (0: a literal name)."""
        if data[at] & ((1 << prefix_bits) - 1):
            index, at = read_integer(data, at, prefix_bits)
            name = self._entry(index)[0]
        else:
            name, at = read_string(data, at + 1)
        value, at = read_string(data, at)
        return (name, value), at

    def _add(self, name: bytes, value: bytes) -> None:
        self._entries.appendleft((name, value))  # one larger than the table empties it
        self._size += ENTRY_OVERHEAD + len(name) + len(value)
        self._shrink()

    def _shrink(self) -> None:
        while self._size > self._max:
            name, value = self._entries.pop()
            self._size -= ENTRY_OVERHEAD + len(name) + len(value)


def read_integer(data: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at `at` in an N-bit prefix (§5.1), and where what follows it starts."""
    if at >= len(data):
        raise HPACKDecodingError("Unable to decode HPACK integer representation")
    limit = (1 << prefix_bits) - 1
    number = data[at] & limit
    used = 1
    if number == limit:
        shift = 0
        while True:
            if at + used >= len(data):
                raise HPACKDecodingError("Unable to decode HPACK integer representation")
            octet = data[at + used]
            used += 1
            number += (octet & 0x7F) << shift
            if octet < 0x80:
                break
            shift += 7
            if used > VARINT_MAX_LENGTH:
                raise HPACKDecodingError("Variable integer representation is too long")
    return number, at + used


def read_string(data: bytes, at: int) -> tuple[bytes, int]:
    """The string literal at `at` (§5.2), Huffman-decoded if it says so, and where what
    follows it starts."""
    length, start = read_integer(data, at, 7)
    stop = start + length
    if stop > len(data):
        raise HPACKDecodingError("Truncated header block")
    text = data[start:stop]
    if data[at] & 0x80:
        text = decode_huffman(text)
    return text, stop
