"""Benchmark apps from OCI images (issue 36): an image's first start on a node against podman's
pull + run of the same image, and a cached image's wake against the same program as a
directory app. Every row has its baseline measured in the same run, alternated with it.

Two images, made from this machine's files (`tests.support.images`) and pushed to Debian's
`docker-registry` on loopback (plain HTTP):
  busybox  Debian's static busybox, `httpd -f -p 8080 -h /www` (`BUSYBOX_CONFIG`), ~1 MB;
  python   this machine's Python (`python_layer()`, ~70 MB uncompressed) and a layer with a
           tiny `http.server` app, `Cmd ["python3", "app.py"]`, `ExposedPorts 8080/tcp`.

1. First start on a node, --runs R of each kind per image, podman and wakeful alternated:
   - podman (baseline): `podman pull --tls-verify=false REF`, `podman run -d -p
     127.0.0.1:PORT:8080 REF`, then GET / every ~1 ms until a 200; pull start -> that 200.
     The image is removed (`podman rmi`) after each run, so every pull is cold.
   - wakeful: a fresh `wakeful up` (a new data directory: empty blob store, empty image
     cache) with no app, its node ready and quiet (1 s), then `wakeful deploy --image REF
     --name APP` (min_instances 0: the control plane pulls the image into its blob store and
     the deploy warms the node's cache) and one GET / through the ingress (Host:
     APP.localhost, a fresh connection) on its return; deploy start -> that answer's first
     byte, split into the deploy command and the first request (send -> first byte); and,
     for scale, `wakeful apps` timed alone against the same `wakeful up` (the CLI's own
     start and one API call). Under it, the first request's phases from WAKEFUL_TRACE marks.
2. Cached wake, one `wakeful up` with --copies N apps of each kind, all at zero:
   `img1..imgN` the busybox image (`image = REF`, its own port 8080 behind a network
   namespace and pasta), `dir1..dirN` a directory app running the same program from the host
   (`command = ["busybox", "httpd", "-f", "-p", "$PORT", "-h", "www"]`, `www/index.html`);
   TCP readiness for both. Once every image copy's tree is unpacked (`image_cache.images` of
   /v1/nodes is N), one GET / per copy, image and directory alternated (which goes first
   alternates too), each after 0.3 s of quiet: send -> first byte, p50/p95/max per kind and
   the difference (the issue's goal: within 2 ms at p50); then each wake's phases from
   WAKEFUL_TRACE marks, side by side. Directory apps start from a warm slot (a sandbox made
   ahead, waiting for its app); image apps start cold (no warm slot: tree, overlay, network
   namespace and pasta, then the bwrap chain).
3. Per-request cost of the pasta hop, warm (--wrk S seconds, 0 skips it; needs `wrk`): img1
   and dir1 woken, then `wrk -t1 -c8 -dS` through the ingress against each, alternated
   twice; requests/s and wrk's latency p50/p99.
4. Pieces of an image start, timed alone in this process (root only), --pieces K times each:
   `open_sandbox_net` + its close (a holder with a user and network namespace, pasta
   forwarding a port into it); a sandbox tmpfs with the image's overlay on it, then unmounted;
   the slot program's interpreter start (`python3 -I -S -c pass`, which the image chain runs
   before the chroot).

Each `wakeful up`'s output is scanned for warning/error lines (--keep-logs DIR keeps it). The
wakeful processes run without PYTHONDONTWRITEBYTECODE (so the CLI imports from .pyc, as an
installed wakeful does: with it set, every `wakeful` command compiles its modules again).

Figures only, no assertions. From the repository root, as root, as a module:

    .venv/bin/python -m bench.images [--runs 3] [--copies 10] [--pieces 20] [--wrk 5]
        [--keep-logs DIR]
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:
    sys.exit("run it from the repository root as a module: python -m bench.images")

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.coldstart import WAKEFUL, Up, exchange, pct, running_up, status_of, wait_all_at_zero
from tests.support.images import (
    BUSYBOX_CONFIG,
    OciLayout,
    busybox_layers,
    directory,
    file,
    layer,
    python_layer,
)
from tests.support.registry import Registry, running_registry
from wakeful.domain.models.images import ImageConfig
from wakeful.store.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "ops" / "container" / "containers.conf")}
"""podman as this project runs it here (runc, cgroupfs: `tests/support/podman.py`)."""
PYTHON_APP = b"""import http.server

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from python\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("", 8080), Hello).serve_forever()
"""
PYTHON_CONFIG = ImageConfig(
    cmd=["python3", "app.py"], working_dir="/app", exposed_ports=["8080/tcp"]
)
DIR_COMMAND = ["busybox", "httpd", "-f", "-p", "$PORT", "-h", "www"]
INDEX_HTML = b"<h1>hello from a directory</h1>\n"
QUIET = 0.3
"""Seconds each wake of section 2 waits first: the one before it has settled."""
SETTLE = 1.0
"""Seconds a fresh `wakeful up` is left alone once its node is ready (its warm slots made)."""
FIRST_PHASES = [
    ("send -> placed (ingress, activator, controller)", "send", "placed"),
    ("placed -> booting (node: claim, records)", "placed", "booting"),
    ("booting -> spawned (tree, overlay, netns + pasta, exec)", "booting", "spawned"),
    ("spawned -> first probe ok (chain, app boot, probe)", "spawned", "probed"),
    ("probe ok -> answer head (ready, lease, proxy)", "probed", "answered"),
    ("answer head -> first byte at the client", "answered", "done"),
]
WAKE_PHASES = [
    ("send -> placed (ingress, activator, controller)", "send", "placed"),
    ("placed -> booting (node: claim, records)", "placed", "booting"),
    ("booting -> spawned (start: slot or chain)", "booting", "spawned"),
    ("spawned -> first probe ok", "spawned", "probed"),
    ("probe ok -> answer head (ready, lease, proxy)", "probed", "answered"),
    ("answer head -> first byte at the client", "answered", "done"),
]
WRK_LATENCY = re.compile(r"^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$", re.M)
WRK_RATE = re.compile(r"Requests/sec:\s+([0-9.]+)")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def table(headers: list[str], rows: list[list[str]]) -> None:
    """A Markdown table, its first column left-aligned, the others right."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    print(line(headers))
    print(
        "|"
        + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths))
        + "|"
    )
    for row in rows:
        print(line(row))


def get_200(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(64).split(b" ", 2)[1:2] == [b"200"]
    except OSError:
        return False


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout


# -- the images ---------------------------------------------------------------------------


def push_images(layout_dir: Path, registry: Registry) -> dict[str, str]:
    """Both images written to an OCI layout and pushed; kind -> reference."""
    layout = OciLayout(layout_dir)
    layout.add_image("busybox", busybox_layers(), BUSYBOX_CONFIG)
    app = layer(directory("app"), file("app/app.py", PYTHON_APP))
    layout.add_image("python", [python_layer(), app], PYTHON_CONFIG)
    return {
        kind: registry.push(f"oci:{layout.path}:{kind}", f"bench/{kind}:1")
        for kind in ("busybox", "python")
    }


# -- section 1: first start ---------------------------------------------------------------


@dataclass
class FirstStarts:
    podman: list[float] = field(default_factory=list)
    pull: list[float] = field(default_factory=list)
    run: list[float] = field(default_factory=list)
    wakeful: list[float] = field(default_factory=list)
    deploy: list[float] = field(default_factory=list)
    request: list[float] = field(default_factory=list)
    cli: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    ups: list[Up] = field(default_factory=list)


def podman(*args: str, check: bool = True) -> None:
    done = subprocess.run(["podman", *args], env=PODMAN_ENV, capture_output=True, timeout=300)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.decode()[-2000:]}")


def podman_once(ref: str, into: FirstStarts, name: str) -> None:
    port = free_port()
    podman("rm", "--force", "--ignore", "--time", "0", name, check=False)
    podman("rmi", "--force", "--ignore", ref, check=False)
    started = time.perf_counter()
    try:
        podman("pull", "-q", "--tls-verify=false", ref)
        pulled = time.perf_counter()
        podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8080", ref)
        ran = time.perf_counter()
        while not get_200(port):
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"{ref} under podman did not answer 200 within 120 s")
            time.sleep(0.001)
        answered = time.perf_counter()
    finally:
        podman("rm", "--force", "--ignore", "--time", "0", name, check=False)
        podman("rmi", "--force", "--ignore", ref, check=False)
    into.podman.append(answered - started)
    into.pull.append(pulled - started)
    into.run.append(ran - pulled)


def nodes(up: Up) -> list[dict[str, object]]:
    auth = {"Authorization": f"Bearer {(up.data_dir / 'token').read_text().strip()}"}
    answer = httpx.get(f"{up.api}/v1/nodes", headers=auth, timeout=30)
    answer.raise_for_status()
    found: list[dict[str, object]] = answer.json()
    return found


def wait_node(up: Up, images: int = 0, within: float = 120) -> None:
    """Until a node is registered, and its image cache holds `images` trees."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError, httpx.HTTPStatusError):
            for node in nodes(up):
                cache = node.get("image_cache") or {}
                assert isinstance(cache, dict)
                if node["registered"] and int(cache.get("images", 0)) >= images:
                    return
        time.sleep(0.1)
    raise RuntimeError(f"no node with {images} image(s) unpacked within {within:g} s")


def wakeful_once(ref: str, app: str, into: FirstStarts, keep_logs: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix=f"wakeful-first-{app}-") as tmp:
        with running_up(Path(tmp), [], keep_logs) as up:
            wait_node(up)
            time.sleep(SETTLE)
            cli = [*WAKEFUL, "--data-dir", str(up.data_dir)]
            began = time.perf_counter()
            run([*cli, "apps"])
            into.cli.append(time.perf_counter() - began)
            time.sleep(QUIET)
            port = int(up.proxy.rsplit(":", 1)[1])
            started = time.monotonic()
            run([*cli, "deploy", "--image", ref, "--name", app])
            deployed = time.monotonic()
            for _ in range(20):
                sent, done, answer = exchange(port, f"{app}.localhost")
                into.statuses.append(status_of(answer))
                if status_of(answer) == 200:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"{app} never answered 200: {answer[:300]!r}")
        into.wakeful.append(done - started)
        into.deploy.append(deployed - started)
        into.request.append(done - sent)
        into.phases.append({**up.traces.get(app, {}), "send": sent, "done": done})
        into.ups.append(up)


def first_starts(refs: dict[str, str], runs: int, keep_logs: Path | None) -> None:
    results = {kind: FirstStarts() for kind in refs}
    for round_ in range(runs):
        for kind, ref in refs.items():
            podman_once(ref, results[kind], f"wakeful-bench-{kind}")
            wakeful_once(ref, f"{kind}{round_ + 1}", results[kind], keep_logs)
    print(f"\n## 1. First start of an image on a node ({runs} runs each, alternated)\n")
    headers = ["", "p50 ms", *(f"run {i + 1}" for i in range(runs))]
    rows: list[list[str]] = []
    for kind, found in results.items():
        lines = [
            (f"**{kind}** podman: pull + run -> first 200 (baseline)", found.podman),
            ("  podman pull", found.pull),
            ("  podman run -d (returned)", found.run),
            (f"**{kind}** wakeful: deploy start -> first byte of the 200", found.wakeful),
            ("  `wakeful deploy --image` (returned)", found.deploy),
            ("  first request: send -> first byte", found.request),
            ("  (for scale: `wakeful apps` alone, the CLI's start)", found.cli),
        ]
        for label, values in lines:
            rows.append([label, ms(pct(values, 0.5)), *(ms(v) for v in values)])
        ratio = pct(found.wakeful, 0.5) / pct(found.podman, 0.5)
        rows.append(["  wakeful / podman (p50)", f"{ratio:.2f}x", *("" for _ in range(runs))])
    table(headers, rows)
    print("\nThe first request's phases (WAKEFUL_TRACE), p50 ms per image:\n")
    phase_rows = []
    for label, start, end in FIRST_PHASES:
        cells = [label]
        for found in results.values():
            spans = [p[end] - p[start] for p in found.phases if start in p and end in p]
            cells.append(ms(pct(spans, 0.5)) if spans else "-")
        phase_rows.append(cells)
    table(["", *refs], phase_rows)
    print("\ngoal: a first start takes no longer than podman's pull + run")
    for kind, found in results.items():
        if any(status != 200 for status in found.statuses):
            print(f"      {kind}: first statuses {found.statuses}")
        for up in found.ups:
            up.report()


# -- section 2: cached wake ---------------------------------------------------------------


def make_apps(root: Path, ref: str, copies: int) -> tuple[list[str], list[str]]:
    images = [f"img{i}" for i in range(1, copies + 1)]
    dirs = [f"dir{i}" for i in range(1, copies + 1)]
    tail = '[health]\ntimeout = 30\n[concurrency]\nscale_down_delay = "1h"\nmin_instances = 0\n'
    for name in images:
        (root / name).mkdir()
        (root / name / "wakeful.toml").write_text(
            f'name = "{name}"\nimage = "{ref}"\nshutdown_timeout = 2\n' + tail
        )
    for name in dirs:
        (root / name / "www").mkdir(parents=True)
        (root / name / "www" / "index.html").write_bytes(INDEX_HTML)
        (root / name / "wakeful.toml").write_text(
            f'name = "{name}"\ncommand = {json.dumps(DIR_COMMAND)}\nshutdown_timeout = 2\n' + tail
        )
    return images, dirs


def cached_wakes(ref: str, copies: int, keep_logs: Path | None, wrk: float) -> None:
    seconds: dict[str, list[float]] = {"image": [], "directory": []}
    sent: dict[str, tuple[float, float]] = {}
    statuses: dict[str, list[int]] = {"image": [], "directory": []}
    rates: dict[str, list[tuple[float, float, float]]] = {"image": [], "directory": []}
    with tempfile.TemporaryDirectory(prefix="wakeful-wake-") as tmp:
        root = Path(tmp)
        images, dirs = make_apps(root, ref, copies)
        with running_up(root, images + dirs, keep_logs) as up:
            wait_all_at_zero(up, images + dirs)
            wait_node(up, images=copies)
            time.sleep(SETTLE)
            port = int(up.proxy.rsplit(":", 1)[1])
            for i, pair in enumerate(zip(images, dirs, strict=True)):
                order = pair if i % 2 == 0 else pair[::-1]
                for app in order:
                    kind = "image" if app.startswith("img") else "directory"
                    time.sleep(QUIET)
                    began, done, answer = exchange(port, f"{app}.localhost")
                    seconds[kind].append(done - began)
                    statuses[kind].append(status_of(answer))
                    sent[app] = (began, done)
            if wrk > 0 and shutil.which("wrk"):
                for _ in range(2):
                    for kind, app in (("image", images[0]), ("directory", dirs[0])):
                        rates[kind].append(wrk_run(port, app, wrk))
    print(f"\n## 2. A cached image's wake vs the same program as a directory app ({copies} each)\n")
    rows = []
    for kind, label in (
        ("directory", "directory app, busybox httpd from the host (baseline)"),
        ("image", "busybox image, its tree unpacked"),
    ):
        rows.append([label, *(ms(pct(seconds[kind], q)) for q in (0.5, 0.95, 1))])
    rows.append(
        [
            "image - directory (per percentile)",
            *(ms(pct(seconds["image"], q) - pct(seconds["directory"], q)) for q in (0.5, 0.95, 1)),
        ]
    )
    paired = [a - b for a, b in zip(seconds["image"], seconds["directory"], strict=True)]
    rows.append(
        [
            "  paired: each image wake - its directory twin",
            *(ms(pct(paired, q)) for q in (0.5, 0.95, 1)),
        ]
    )
    table(["send -> first byte", "p50 ms", "p95 ms", "max ms"], rows)
    print("\ngoal: a cached image wakes within 2 ms (p50) of the directory app")
    print("\nWhere the time goes (WAKEFUL_TRACE), p50 ms of each phase:\n")
    phase_rows = []
    for label, start, end in WAKE_PHASES:
        cells = [label]
        p50s = []
        for names in (dirs, images):
            spans = []
            for name in names:
                events = {**up.traces.get(name, {}), "send": sent[name][0], "done": sent[name][1]}
                if start in events and end in events:
                    spans.append(events[end] - events[start])
            p50s.append(pct(spans, 0.5) if spans else float("nan"))
            cells.append(ms(p50s[-1]))
        cells.append(ms(p50s[1] - p50s[0]))
        phase_rows.append(cells)
    table(["", "directory", "image", "image - directory"], phase_rows)
    for kind, found in statuses.items():
        if any(status != 200 for status in found):
            print(f"      {kind}: statuses {found}")
    if rates["image"]:
        print(f"\n## 3. Warm requests through the ingress: wrk -t1 -c8 -d{wrk:g}s, twice each\n")
        wrk_rows = []
        for kind, label in (("directory", "dir1 (baseline)"), ("image", "img1 (pasta hop)")):
            for rate, p50, p99 in rates[kind]:
                wrk_rows.append([label, f"{rate:.0f}", f"{p50:.2f}", f"{p99:.2f}"])
        table(["", "requests/s", "p50 ms", "p99 ms"], wrk_rows)
    elif wrk > 0:
        print("\n(section 3 skipped: no wrk; apt-get install wrk)")
    up.report()


def wrk_run(port: int, app: str, duration: float) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of `wrk -t1 -c8` against `app` through the ingress."""
    argv = ["wrk", "-t1", "-c8", f"-d{duration:g}s", "--latency", "-H", f"Host: {app}.localhost"]
    said = run([*argv, f"http://127.0.0.1:{port}/"], timeout=duration + 60)
    rate = WRK_RATE.search(said)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    latency = {q: float(v) * scale[u] for q, v, u in WRK_LATENCY.findall(said)}
    if rate is None or len(latency) < 2:
        raise RuntimeError(f"wrk said:\n{said}")
    return float(rate.group(1)), latency["50"], latency["99"]


# -- section 3: pieces --------------------------------------------------------------------


async def netns_once() -> float:
    from wakeful.node.jail.netns import open_sandbox_net
    from wakeful.node.jail.uids import UID_BASE, UID_COUNT

    started = time.perf_counter()
    net = await open_sandbox_net(
        host="127.0.0.1", host_port=free_port(), app_port=8080, net_uid=UID_BASE + UID_COUNT - 1
    )
    opened = time.perf_counter()
    await net.close()
    return opened - started


def overlay_once(work: Path, lower: Path) -> tuple[float, float]:
    """(mount, unmount) seconds of a sandbox tmpfs with the image's overlay on it."""
    from wakeful.node.jail.tmpfs import mount_image_root, mount_sandbox_fs, unmount

    tree = work / "fs"
    started = time.perf_counter()
    mount_sandbox_fs(tree, 64 << 20)
    root = mount_image_root(tree, lower)
    mounted = time.perf_counter()
    unmount(root)
    unmount(tree)
    tree.rmdir()
    return mounted - started, time.perf_counter() - mounted


@contextlib.contextmanager
def busybox_tree() -> Iterator[Path]:
    """A busybox root filesystem like the cache's (its files only; the overlay's cost does not
    depend on what the lower tree holds)."""
    with tempfile.TemporaryDirectory(prefix="wakeful-pieces-") as tmp:
        lower = Path(tmp) / "lower"
        for name in ("bin", "etc", "www", "tmp", "proc", "dev"):
            (lower / name).mkdir(parents=True)
        shutil.copy("/bin/busybox", lower / "bin" / "busybox")
        (lower / "www" / "index.html").write_bytes(INDEX_HTML)
        yield lower


BWRAP = [
    *("bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"),
    *("--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"),
    *("--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--"),
]
"""A cold bwrap sandbox of the system directories, as the image chain makes (fewer mounts)."""
CHAIN = [
    *("sh", "-c", 'exec "$@"', "sh", "prlimit", "--nofile=4096:4096", "--"),
    *("setpriv", "--pdeathsig", "KILL", "--", *BWRAP),
]
"""The image chain's steps before the app, as separate execs (its cgroup join is a `sh`)."""


def timed(argv: list[str], count: int) -> list[float]:
    """Seconds each of `count` runs of `argv` took, to its exit."""
    seconds = []
    for _ in range(count):
        began = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - began)
    return seconds


def holder_alone() -> list[str]:
    """The network namespace holder's argv, but exiting once ready instead of sleeping."""
    from wakeful.node.jail.netns import find_tools, holder_argv
    from wakeful.node.jail.uids import UID_BASE, UID_COUNT

    tools = find_tools()
    argv = holder_argv(tools["setpriv"], tools["unshare"], UID_BASE + UID_COUNT - 1)
    argv[-1] = argv[-1].replace(" && exec sleep infinity", "")
    return argv


def pieces(count: int) -> None:
    print(f"\n## 4. Pieces of an image start, timed alone ({count} times each)\n")
    if os.geteuid() != 0:
        print("(skipped: the pieces need root, as the node agent has)")
        return
    opened = [asyncio.run(netns_once()) for _ in range(count)]
    mounts: list[float] = []
    unmounts: list[float] = []
    with busybox_tree() as lower:
        for _ in range(count):
            mounted, undone = overlay_once(lower.parent, lower)
            mounts.append(mounted)
            unmounts.append(undone)
    python = shutil.which("python3", path="/usr/bin:/bin") or "python3"
    bare = [python, "-I", "-S", "-c", "pass"]
    rows = [
        ("`open_sandbox_net`: holder + pasta ready", opened),
        ("  the holder alone (setpriv, unshare, sh)", timed(holder_alone(), count)),
        ("sandbox tmpfs + the image's overlay, mounted", mounts),
        ("  ... and unmounted (not on a wake's path)", unmounts),
        (
            "a stand-in for the image chain (sh, prlimit, setpriv, bwrap, python3 -I -S)",
            timed([*CHAIN, *bare], count),
        ),
        ("  `bwrap ... python3 -I -S -c pass` alone", timed([*BWRAP, *bare], count)),
        ("  `python3 -I -S -c pass` alone (the chain's slot step)", timed(bare, count)),
    ]
    figures = [[label, *(ms(pct(values, q)) for q in (0.5, 0.95, 1))] for label, values in rows]
    table(["", "p50 ms", "p95 ms", "max ms"], figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="first starts of each kind (3)")
    parser.add_argument("--copies", type=int, default=10, help="apps of each kind woken (10)")
    parser.add_argument("--pieces", type=int, default=20, help="times each piece is timed (20)")
    parser.add_argument(
        "--wrk", type=float, default=5, help="seconds of each wrk run (5; 0 skips section 3)"
    )
    parser.add_argument("--keep-logs", type=Path, help="copy each `wakeful up` output here")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # see the docstring
    podman_version = run(["podman", "--version"], PODMAN_ENV).strip()
    print(
        f"wakeful images bench: Python {platform.python_version()}, {platform.platform()},"
        f" {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), {podman_version},"
        f" load average {os.getloadavg()[0]:.2f} at the start"
    )
    print(
        f"command: {shlex.join([Path(sys.executable).name, '-m', 'bench.images', *sys.argv[1:]])}"
    )
    with (
        tempfile.TemporaryDirectory(prefix="wakeful-images-bench-") as tmp,
        running_registry(Path(tmp) / "registry") as registry,
    ):
        refs = push_images(Path(tmp) / "layout", registry)
        if args.runs > 0:
            first_starts(refs, args.runs, args.keep_logs)
        if args.copies > 0:
            cached_wakes(refs["busybox"], args.copies, args.keep_logs, args.wrk)
    if args.pieces > 0:
        pieces(args.pieces)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
