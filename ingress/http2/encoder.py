"""HPACK for what the ingress sends on HTTP/2 (answers to clients, requests to h2c apps): the
static table (RFC 7541 Appendix A), literals for the rest, and no dynamic table at all.

`h2` asks its encoder for each header block it sends; hpack's own `Encoder` is pure Python
and looks every field up in its tables, which cost a tenth of a small HTTP/2 answer's CPU
(docs/design/http2.md, "Measured"). Sending never needs a dynamic table (RFC 7541 §2.3.2:
an encoder chooses what to index), so this one indexes nothing: a field whose name and value
are a static entry is one byte, one whose name is is its index and a literal value, any other
two literals; no Huffman coding (a few bytes more a head). The peer's decoder is told at the
first block, and again after each change of its SETTINGS_HEADER_TABLE_SIZE, that the table
this encoder uses holds nothing (a dynamic table size update to 0, §6.3): whatever size the
peer allows, 0 is within it. What goes in was made safe already (`headers.client_response_
headers`, `upstream.h2c`); decoding what comes in stays hpack's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, cast

import h2.connection
import hpack
from hpack.table import HeaderTable


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
            self._told = True
        for name, value in headers:
            field(out, name, value)
        return bytes(out)


def fit(conn: h2.connection.H2Connection) -> None:
    """Make `FieldEncoder` the encoder of `conn` (h2 asks it for `encode` and sets
    `header_table_size`, nothing else)."""
    conn.encoder = cast(hpack.Encoder, FieldEncoder())
