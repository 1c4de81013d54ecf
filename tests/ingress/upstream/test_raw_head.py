"""The request head the ingress writes to an HTTP/1.1 sandbox (`upstream.raw.request_head`):
its framing is the ingress's own, whatever the client declared."""

from __future__ import annotations

import pytest

from wakeful.ingress.upstream.raw import request_head


@pytest.mark.parametrize(
    ("length", "with_body", "sent", "chunked"),
    [
        (b"40", False, None, False),  # no body follows: a length would frame the next request
        (b"0", False, b"0", False),  # kept: a body-less POST may need it (411)
        (b"00", False, None, False),
        (None, False, None, False),
        (b"3", True, b"3", False),  # the body frames itself by it
        (None, True, None, True),  # a body of unknown length goes chunked
    ],
)
def test_a_request_head_carries_a_length_only_for_a_body(
    length: bytes | None, with_body: bool, sent: bytes | None, chunked: bool
) -> None:
    headers = [(b"host", b"hello.localhost")]
    if length is not None:
        headers.append((b"content-length", length))
    head, goes_chunked = request_head("POST", b"/", b"127.0.0.1:1", headers, with_body)
    lines = head.split(b"\r\n")
    lengths = [line.split(b": ", 1)[1] for line in lines if line.startswith(b"content-length:")]
    assert lengths == ([] if sent is None else [sent])
    assert goes_chunked is chunked
    assert (b"transfer-encoding: chunked" in lines) is chunked
