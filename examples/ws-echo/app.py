"""A small stdlib-only WebSocket app for wakeful: it listens on $HOST:$PORT (wakeful sets both).

GET /healthz                      -> "ok"
GET /  (Upgrade: websocket)       -> a WebSocket that echoes every message back (text or
                                     binary, fragments included), answers pings, and closes
                                     when the client does
GET /  (plain)                    -> a line saying to open a WebSocket

Try it: `wakeful up examples/ws-echo`, then from Python (`pip install websockets`):

    import socket
    from websockets.sync.client import connect
    sock = socket.create_connection(("127.0.0.1", 8080))  # see below
    with connect("ws://ws-echo.localhost:8080/", sock=sock) as ws:
        ws.send("hello"); print(ws.recv())

(`sock`: the system resolver may not take `*.localhost` for loopback, as browsers and curl
do: systemd's does, a plain `/etc/hosts` does not.)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_FRAME = 16 * 1024 * 1024


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self.answer(200, b"ok\n")
        elif self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
        else:
            self.answer(200, b"open a WebSocket here to have your messages echoed\n")

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def websocket(self) -> None:
        key = self.headers.get("Sec-WebSocket-Key", "").encode()
        if not key:
            self.answer(400, b"no Sec-WebSocket-Key\n")
            return
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(ConnectionError, EOFError):
            self.echo()

    def read(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) < n:
            raise EOFError
        return data

    def echo(self) -> None:
        while True:
            first, second = self.read(2)
            opcode, masked, length = first & 0x0F, second & 0x80, second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self.read(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", self.read(8))
            if length > MAX_FRAME:
                self.send_frame(0x88, struct.pack("!H", 1009))  # message too big
                return
            mask = self.read(4) if masked else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.read(length)))
            if opcode == 0x8:  # close: answer it, then end
                self.send_frame(0x88, payload[:2])
                return
            if opcode == 0x9:  # ping
                self.send_frame(0x8A, payload)
            elif opcode in (0x0, 0x1, 0x2):  # continuation, text, binary: back as they came
                self.send_frame(first & 0x8F, payload)

    def send_frame(self, first: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", first, n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", first, 126, n)
        else:
            head = struct.pack("!BBQ", first, 127, n)
        self.wfile.write(head + payload)
        self.wfile.flush()


def main() -> None:
    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ThreadingHTTPServer.address_family = family
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    print(f"ws-echo listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
