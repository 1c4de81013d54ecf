"""The "vault" app: a sandbox that answers with one variable of its environment, to show that
an app's secrets reach it (and which value it has now)."""

from __future__ import annotations

import secrets
from pathlib import Path

from tests.support.prober import Answer, Prober

APP = """\
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        status, body = 200, b"ok"
        if url.path == "/env":
            name = parse_qs(url.query).get("name", [""])[0]
            value = os.environ.get(name)
            status, body = (404, b"unset") if value is None else (200, value.encode())
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler).serve_forever()
"""


def vault_app(root: Path, name: str = "vault", env: dict[str, str] | None = None) -> Path:
    """The app's directory: `env` goes into its manifest's `env`."""
    target = root / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "app.py").write_text(APP)
    manifest = f'name = "{name}"\ncommand = ["python3", "app.py"]\nshutdown_timeout = 5\n'
    manifest += '[health]\npath = "/healthz"\ntimeout = 20\n'
    manifest += '[concurrency]\nrequests_per_instance = 10\nscale_down_delay = "120s"\n'
    if env:
        manifest += "[env]\n" + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    (target / "wakeful.toml").write_text(manifest)
    return target


def secret_value() -> str:
    """A value no file holds by chance."""
    return f"s3cret-{secrets.token_hex(12)}"


def files_holding(root: Path, needle: str) -> list[Path]:
    """Every regular file under `root` whose raw bytes hold `needle`."""
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes():
                found.append(path)
        except OSError:  # gone while we looked (a sandbox's files), or a socket
            continue
    return found


def failures(prober: Prober) -> list[Answer]:
    """What `prober` got that was not the vault app's own answer: 200 with a value, or its 404
    `unset` (the variable is not set in that sandbox)."""
    return [a for a in prober.failed() if not (a.status == 404 and a.text == "unset")]
