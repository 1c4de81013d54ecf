"""A small stdlib-only stateful app for wakeful: notes in a SQLite file under data/.

GET /            -> every note, one per line, and the instance that answers (X-Instance)
POST /           -> appends the request body as a note; answers its number
GET /sleep?s=N   -> waits N seconds, then answers (to hold a request in flight)
GET /healthz     -> "ok"

`data/` is the app's `[state]`: wakeful archives it when the sandbox stops and restores it
where the app wakes next, so the notes survive scale-to-zero and moves between nodes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

INSTANCE = os.urandom(4).hex()
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
LOCK = threading.Lock()


def database() -> sqlite3.Connection:
    os.makedirs(DATA, exist_ok=True)
    connection = sqlite3.connect(os.path.join(DATA, "notes.db"), check_same_thread=False)
    connection.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT)")
    connection.commit()
    return connection


DB = database()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Instance", INSTANCE)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._answer(200, b"ok")
        elif url.path == "/sleep":
            time.sleep(float(parse_qs(url.query).get("s", ["1"])[0]))
            self._answer(200, b"slept")
        elif url.path == "/":
            with LOCK:
                rows = DB.execute("SELECT text FROM notes ORDER BY id").fetchall()
            self._answer(200, "".join(f"{text}\n" for (text,) in rows).encode())
        else:
            self._answer(404, b"not found")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 65536:
            self._answer(413, b"a note is at most 64 KiB")
            return
        text = self.rfile.read(length).decode(errors="replace")
        with LOCK:
            cursor = DB.execute("INSERT INTO notes (text) VALUES (?)", (text,))
            DB.commit()
        self._answer(201, f"{cursor.lastrowid}\n".encode())


def main() -> None:
    server = ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler)
    server.daemon_threads = True

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"notes listening on {os.environ['HOST']}:{os.environ['PORT']}", flush=True)
    server.serve_forever()
    with LOCK:
        DB.close()  # everything committed is in data/notes.db: the archive takes it
    sys.exit(0)


if __name__ == "__main__":
    main()
