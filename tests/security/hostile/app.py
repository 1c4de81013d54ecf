"""A hostile app: every attack on the control plane the security suite knows, on demand.

GET /healthz  -> ok
GET /attack   -> a JSON object, one entry per attempt: {"done": bool, "detail": str}.
                 `done` means the attempt got what it wanted (a leak, a write, a connection,
                 a signal delivered, a limit passed); the test decides what must be false.
GET /grandchild -> starts a `setsid` grandchild (a sleep with a marker argument) and answers.

It learns its targets from its environment (set by the test in wakeful.toml): DATA_DIR,
CONTROL_PID, PORTS (comma-separated name=port or name=host:port: the control plane's and
another app's ports),
MARKER (a unique number the test looks for among processes later).
Stdlib only, like the sample app.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MiB = 1 << 20


def attempt(fn):  # type: ignore[no-untyped-def]
    try:
        done, detail = fn()
    except Exception as exc:  # the attempt failed: that is the point
        return {"done": False, "detail": f"{type(exc).__name__}: {exc}"[:300]}
    return {"done": bool(done), "detail": str(detail)[:300]}


def read(path: str) -> tuple[bool, str]:
    with open(path, "rb") as f:
        data = f.read(4096)
    return True, data[:200].decode(errors="replace")


def read_token() -> tuple[bool, str]:
    for path in ("../../../token", os.path.join(os.environ["DATA_DIR"], "token")):
        try:
            return read(path)
        except OSError:
            continue
    raise PermissionError("no token file reachable")


def environ_of(pid: int) -> tuple[bool, str]:
    """Another process's environment, readable at all, is a leak (tokens live there)."""
    return read(f"/proc/{pid}/environ")


def other_secret() -> tuple[bool, str]:
    """Another app's secret (HELLO_SECRET, set on the hello app by the test), from any
    process's environment this sandbox can read."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if b"HELLO_SECRET=" in environ:
                return True, f"in the environment of pid {entry}"
    raise PermissionError("no readable environment holds HELLO_SECRET")


def other_files() -> tuple[bool, str]:
    root = os.path.join(os.environ["DATA_DIR"], "sandboxes")
    mine = os.path.basename(os.path.dirname(os.getcwd()))
    others = [name for name in os.listdir(root) if name != mine]
    for name in others:
        for sub in ("app/app.py", "rw/app.py", "output.log"):
            path = os.path.join(root, name, sub)
            if os.path.exists(path):
                return read(path)
    return False, f"saw {others} but could read nothing"


def write_outside() -> tuple[bool, str]:
    wrote = []
    marker = os.environ["MARKER"]
    targets = [os.path.join(os.environ["DATA_DIR"], "pwned"), f"/etc/wakeful-pwned-{marker}"]
    for path in targets:
        try:
            with open(path, "w") as f:
                f.write("pwned")
            wrote.append(path)
        except OSError:
            continue
    return bool(wrote), f"wrote {wrote}"


def connect(target: str) -> tuple[bool, str]:
    """`target`: a port on 127.0.0.1, or host:port."""
    host, _, port = target.rpartition(":")
    with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
        return True, f"connected to {target}"


def abstract_socket() -> tuple[bool, str]:
    """An abstract UNIX socket of the host (the test's, named after MARKER): the network
    namespace is shared, so only a Landlock scope keeps it out of reach."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2)
        sock.connect("\0wakeful-hostile-" + os.environ["MARKER"])
        return True, "connected to the host's abstract socket"


def signal_control() -> tuple[bool, str]:
    os.kill(int(os.environ["CONTROL_PID"]), 0)  # existence and permission, no harm
    return True, "may signal the control plane"


def fork_bomb() -> tuple[bool, str]:
    """Start sleeping children until the system says no; passing 4x `processes` counts as
    not contained. All are killed before answering."""
    limit = int(os.environ["PROCESSES"]) * 4
    children = []
    try:
        while len(children) < limit:
            children.append(subprocess.Popen(["sleep", "30"]))
    except OSError as exc:
        return False, f"stopped at {len(children)}: {exc}"
    finally:
        for child in children:
            child.kill()
            child.wait()
    return True, f"started {len(children)} processes"


def allocate() -> tuple[bool, str]:
    """A child allocates 4x `memory` and touches it; it must not survive."""
    size = int(os.environ["MEMORY"]) * 4
    code = f"b = bytearray({size}); b[::4096] = b'x' * len(b[::4096]); print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    return done.returncode == 0, f"exit {done.returncode}"


def user_namespace() -> tuple[bool, str]:
    """In a user namespace of its own an app holds every capability over it."""
    done = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True, timeout=30)
    return done.returncode == 0, done.stderr.strip() or f"exit {done.returncode}"


def fill_disk() -> tuple[bool, str]:
    """Write up to 4x `disk` into its own directory; passing it counts as not contained."""
    limit = int(os.environ["DISK"]) * 4
    written = 0
    block = b"x" * MiB
    try:
        with open("fill.bin", "wb") as f:
            while written < limit:
                f.write(block)
                f.flush()
                written += len(block)
    except OSError as exc:
        return False, f"stopped at {written // MiB} MiB: {exc}"
    finally:
        os.remove("fill.bin")
    return True, f"wrote {written // MiB} MiB"


def attacks() -> dict[str, dict[str, object]]:
    found = {
        "read the token file": attempt(read_token),
        "read /proc/1/environ": attempt(lambda: environ_of(1)),
        "read its parent's environ": attempt(lambda: environ_of(os.getppid())),
        "read the control plane's environ": attempt(
            lambda: environ_of(int(os.environ["CONTROL_PID"]))
        ),
        "read store.db": attempt(lambda: read(os.path.join(os.environ["DATA_DIR"], "store.db"))),
        "read another app's files": attempt(other_files),
        "read another app's secret": attempt(other_secret),
        "write outside its directory": attempt(write_outside),
        "signal the control plane": attempt(signal_control),
        "fork past `processes`": attempt(fork_bomb),
        "allocate past `memory`": attempt(allocate),
        "fill the disk": attempt(fill_disk),
        "create a user namespace": attempt(user_namespace),
        "connect to a host abstract socket": attempt(abstract_socket),
    }
    for name_port in os.environ.get("PORTS", "").split(","):
        if name_port:
            name, _, target = name_port.partition("=")
            found[f"connect to {name}"] = attempt(lambda t=target: connect(t))
    return found


def grandchild() -> None:
    marker = os.environ["MARKER"]
    subprocess.Popen(["setsid", "sleep", marker], start_new_session=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/attack":
            body = json.dumps(attacks()).encode()
        elif self.path == "/grandchild":
            grandchild()
            time.sleep(0.2)
            body = b"started"
        else:
            body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler)
    print(f"hostile listening on {os.environ['HOST']}:{os.environ['PORT']}", flush=True)
    server.serve_forever()
