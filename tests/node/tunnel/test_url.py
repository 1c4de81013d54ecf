"""`WAKEFUL_TUNNEL`, parsed (`wakeful/node/tunnel/url.py`): the WebSocket URL every stream
opens, or a refusal that names the value."""

from __future__ import annotations

import pytest

from wakeful.node.tunnel.url import TunnelURL, TunnelURLError, parse_url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(
            "https://edge.example/",
            TunnelURL("wss://edge.example:443/v1/tunnel", secure=True),
            id="https: TLS on 443, the trailing slash dropped",
        ),
        pytest.param(
            "http://10.0.0.5:8443",
            TunnelURL("ws://10.0.0.5:8443/v1/tunnel", secure=False),
            id="http with a port: plain, on that port",
        ),
        pytest.param(
            "https://edge.example/wakeful/",
            TunnelURL("wss://edge.example:443/wakeful/v1/tunnel", secure=True),
            id="a path prefix is kept",
        ),
        pytest.param(
            "http://[::1]:9000",
            TunnelURL("ws://[::1]:9000/v1/tunnel", secure=False),
            id="an IPv6 host keeps its brackets",
        ),
        pytest.param(
            "wss://edge.example",
            TunnelURL("wss://edge.example:443/v1/tunnel", secure=True),
            id="wss is taken as https",
        ),
    ],
)
def test_parse_url(given: str, expected: TunnelURL) -> None:
    assert parse_url(given) == expected


@pytest.mark.parametrize(
    ("given", "said"),
    [
        pytest.param("ftp://edge.example", "must start with", id="another scheme"),
        pytest.param("https://", "names no host", id="no host"),
        pytest.param("https://edge.example:99999", "invalid port", id="a port out of range"),
    ],
)
def test_what_parse_url_refuses(given: str, said: str) -> None:
    with pytest.raises(TunnelURLError, match=said):
        parse_url(given)
