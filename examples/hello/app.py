"""A small stdlib-only HTTP app for wakeful: it listens on $HOST:$PORT (wakeful sets both).

GET /            -> "hello from <pid> instance <id>" (the pid is the one inside its sandbox,
                    often 2; the instance id tells sandboxes apart)
GET /sleep?s=N   -> waits N seconds, then answers (to hold a request in flight)
GET /bytes?n=N   -> N bytes of data, streamed in 64 KiB chunks
POST /echo       -> the request body back, streamed, with its sha256 in X-Body-Sha256
GET /healthz     -> "ok"
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

CHUNK = 64 * 1024
INSTANCE = os.urandom(4).hex()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hello/1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes

    def log_message(self, format: str, *args: object) -> None:  # quiet by default
        if os.environ.get("HELLO_LOG"):
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/healthz":
            self._send(200, b"ok")
        elif url.path == "/sleep":
            time.sleep(float(query.get("s", ["1"])[0]))
            self._send(200, f"slept in {os.getpid()} instance {INSTANCE}\n".encode())
        elif url.path == "/bytes":
            total = int(query.get("n", ["0"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(total))
            self.end_headers()
            block = b"w" * CHUNK
            left = total
            while left > 0:
                self.wfile.write(block[: min(CHUNK, left)])
                left -= CHUNK
        elif url.path == "/headers":
            lines = "".join(f"{k}: {v}\n" for k, v in self.headers.items())
            self._send(200, lines.encode())
        else:
            self._send(200, f"hello from {os.getpid()} instance {INSTANCE}\n".encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        digest = hashlib.sha256()
        chunks = []
        left = length
        while left > 0:
            chunk = self.rfile.read(min(CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            chunks.append(chunk)
            left -= len(chunk)
        body = b"".join(chunks)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Body-Sha256", digest.hexdigest())
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a burst of connections waits in the backlog, not refused


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    server = Server((host, port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"hello listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
