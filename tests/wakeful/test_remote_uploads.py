"""The CLI's streamed uploads across activators: an activator that stands by answers 503 and
the call goes to the next one, which gets the whole body from its start again (a generator
already read half-way would send the rest only)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from wakeful.remote import ControlClient
from wakeful.remote.wire import Endpoint

DIGEST = "sha256:" + "a" * 64


class Recorder(http.server.BaseHTTPRequestHandler):
    standby = False
    bodies: list[bytes]

    def do_PUT(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else self._chunked()
        if self.standby:  # read it all, then stand by
            self._answer(503, b'{"error": "standby", "detail": "not leading"}')
            return
        self.bodies.append(body)
        self._answer(201, b'{"blob": "x", "archive": "' + b"0" * 64 + b'"}')

    def _chunked(self) -> bytes:
        data = b""
        while size := int(self.rfile.readline().strip(), 16):
            data += self.rfile.read(size)
            self.rfile.readline()
        self.rfile.readline()
        return data

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve(standby: bool, bodies: list[bytes]) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (Recorder,), {"standby": standby, "bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def activators() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []
    standby, leader = serve(True, bodies), serve(False, bodies)
    try:
        urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in (standby, leader)]
        yield ",".join(urls), bodies
    finally:
        for server in (standby, leader):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("call", ["put_blob", "put_image_archive"])
def test_a_stream_refused_by_a_standby_reaches_the_leader_whole(
    activators: tuple[str, list[bytes]], tmp_path: Path, call: str
) -> None:
    urls, bodies = activators
    data = bytes(range(256)) * 12_000  # three chunks of a MiB and some
    path = tmp_path / "blob"
    path.write_bytes(data)
    with ControlClient(Endpoint(urls, "token")) as api:
        if call == "put_blob":
            api.put_blob(DIGEST, path)
        else:
            api.put_image_archive(path)
    assert bodies == [data]
