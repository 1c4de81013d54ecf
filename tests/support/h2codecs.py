"""`h2` with the ingress's own HPACK, for the tests that hold `http2.wire` and
`http2.client` to `h2` (the codecs the ingress gave `h2` when it framed with it)."""

from __future__ import annotations

from typing import cast

import h2.connection
import hpack

from wakeful.ingress.http2.fields import FieldDecoder, FieldEncoder


def fit(conn: h2.connection.H2Connection, max_header_list_size: int) -> None:
    """Make `FieldEncoder` and `FieldDecoder` the codecs of `conn` (h2 asks its encoder for
    `encode` and sets its `header_table_size`; asks its decoder for `decode` and sets its
    `max_header_list_size` and `max_allowed_table_size`; nothing else)."""
    conn.encoder = cast(hpack.Encoder, FieldEncoder())
    conn.decoder = cast(hpack.Decoder, FieldDecoder(max_header_list_size))
