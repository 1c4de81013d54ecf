"""tests/support/pebble.py: a certificate for `shop.test` from Debian's pebble over real ACME
(certbot's `acme` library), its HTTP-01 challenge answered by a server of the test's own."""

from __future__ import annotations

import datetime
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from acme import challenges, client, crypto_util, messages
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from josepy.jwk import JWKRSA

from tests.support.pebble import NEW_ORDER, pebble_installed, running_pebble
from wakeful.store.testing import free_port

pytestmark = pytest.mark.skipif(not pebble_installed(), reason="needs Debian's pebble")

NAME = "shop.test"


@pytest.fixture
def answers() -> Iterator[tuple[int, dict[str, bytes]]]:
    """An HTTP-01 responder on 127.0.0.1: (its port, path → body, for the test to fill in)."""
    served: dict[str, bytes] = {}

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path)
            self.send_response(404 if body is None else 200)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_certificate_for_a_name_validated_over_http01(
    tmp_path: Path, answers: tuple[int, dict[str, bytes]]
) -> None:
    port, served = answers
    with running_pebble(tmp_path / "pebble", http_port=port, validity=3600) as pebble:
        account = JWKRSA(key=rsa.generate_private_key(public_exponent=65537, key_size=2048))
        net = client.ClientNetwork(account, verify_ssl=str(pebble.ca_file))  # type: ignore[arg-type]
        acme = client.ClientV2(client.ClientV2.get_directory(pebble.directory, net), net)
        acme.new_account(
            messages.NewRegistration.from_data(email="ops@shop.test", terms_of_service_agreed=True)
        )
        key = ec.generate_private_key(ec.SECP256R1())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        order = acme.new_order(crypto_util.make_csr(key_pem, [NAME]))
        for authorization in order.authorizations:
            for challenge in authorization.body.challenges:
                if isinstance(challenge.chall, challenges.HTTP01):
                    response, validation = challenge.response_and_validation(account)
                    served[challenge.chall.path] = validation.encode()
                    acme.answer_challenge(challenge, response)
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=60)
        order = acme.poll_and_finalize(order, deadline)
        roots = x509.load_pem_x509_certificates(pebble.issuing_roots())
        assert pebble.log().count(NEW_ORDER) == 1

    chain = x509.load_pem_x509_certificates(order.fullchain_pem.encode())
    leaf = chain[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [NAME]
    assert leaf.public_key() == key.public_key()
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert lifetime <= datetime.timedelta(seconds=3600)
    (root,) = roots
    assert len(chain) == 2  # leaf and intermediate (PEBBLE_CHAIN_LENGTH unset: 1)
    for child, parent in zip(chain, [*chain[1:], root], strict=True):
        child.verify_directly_issued_by(parent)  # the issuer's name and signature
    root.verify_directly_issued_by(root)
