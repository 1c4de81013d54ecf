"""Where `wakeful up` says each app answers (`wakeful.up.app_address`)."""

from __future__ import annotations

import pytest

from wakeful.up import app_address


@pytest.mark.parametrize(
    ("listen", "tls_port", "expected"),
    [
        pytest.param("127.0.0.1:8080", 0, "http://web.localhost:8080/", id="loopback: localhost"),
        pytest.param("0.0.0.0:80", 0, "http://web.localhost:80/", id="every address: localhost"),
        pytest.param(
            "localhost:8080", 0, "http://web.localhost:8080/", id="localhost stays localhost"
        ),
        pytest.param("example.test:8080", 0, "http://web.example.test:8080/", id="a name is kept"),
        pytest.param(
            "127.0.0.1:8080",
            8443,
            "http://web.localhost:8080/ and https://web.localhost:8443/",
            id="served over TLS too: both addresses",
        ),
        pytest.param("[::1]:8080", 0, "http://web.[::1]:8080/", id="an IPv6 host is kept as is"),
    ],
)
def test_app_address(listen: str, tls_port: int, expected: str) -> None:
    assert app_address("web", listen, tls_port) == expected
